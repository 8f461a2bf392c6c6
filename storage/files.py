"""Reading the user's files (no Prefect here: the CLI imports it too)."""

from __future__ import annotations

from pathlib import Path

from planner.errors import MeshplanError
from planner.specs.cluster import ClusterSpec, parse_cluster_toml


def read_cluster_file(path: str | Path) -> ClusterSpec:
    """Parse a cluster TOML file; a missing file or a bad field is a MeshplanError naming the fix."""
    p = Path(path)
    if not p.is_file():
        raise MeshplanError("--cluster", str(path), "no such file; pass a cluster TOML file (see examples/clusters/)")
    return parse_cluster_toml(p.read_text(), origin=p.name)
