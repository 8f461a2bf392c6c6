"""Prefect task of `meshplan export-weights`: a run's checkpoint as Hugging Face weights.

The consolidation imports torch, so it runs in a subprocess (`python -m worker.export_hf`, started
through launcher/group.py and told an ExportSpec); NO_CACHE and no retries: its effect is the folder
it writes, refused when it exists, and a failure leaves nothing there.
"""

from __future__ import annotations

import sys

from prefect import task
from prefect.cache_policies import NO_CACHE

from launcher import group
from planner.errors import MeshplanError
from planner.specs.config import EXPORT_TIMEOUT_S
from planner.specs.hf import ExportSpec

EXPORTER = [sys.executable, "-m", "worker.export_hf"]


@task(name="export-weights", cache_policy=NO_CACHE, retries=0)
def export_weights(spec: ExportSpec, timeout_s: float = EXPORT_TIMEOUT_S) -> str:
    res = group.run(EXPORTER + spec.to_argv(), timeout_s, "export-weights", {"OMP_NUM_THREADS": "1"})
    if res.returncode != 0:
        lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit code {res.returncode}"
        raise MeshplanError("export-weights", spec.checkpoint, last.removeprefix("error: "))
    return spec.out
