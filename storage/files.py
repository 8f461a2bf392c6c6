"""Reading the user's files (no Prefect here: the CLI imports it too)."""

from __future__ import annotations

from pathlib import Path

from planner.inputs import read_input
from planner.specs.cluster import ClusterSpec, parse_cluster_toml


def read_cluster_file(path: str | Path) -> ClusterSpec:
    """Parse a cluster TOML file; a missing file or a bad field is a MeshplanError naming the fix."""
    text = read_input(path, "--cluster", "cluster", "see examples/clusters/")
    return parse_cluster_toml(text, origin=Path(path).name)
