"""bench/fidelity.py's plan selection and its peak-memory reading (the issue #42 item 7 table)."""

import importlib.util
import json
from pathlib import Path

import pytest

import rundir

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("fidelity_bench", ROOT / "bench/fidelity.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_five_named_plans_are_the_layouts_they_name():
    names = bench.select_plans(["dp2", "pp2", "tp2", "zero3", "recompute"], None)
    plans = {n: bench.make_plan(n, bench.fidelity_plans()[n]) for n in names}
    got = [(p.pp, p.stages[0].dp, p.stages[0].tp, p.stages[0].sharding, p.stages[0].recompute) for p in plans.values()]
    assert got == [(1, 2, 1, "none", "none"), (2, 1, 1, "none", "none"), (1, 1, 2, "none", "none"),
                   (1, 2, 1, "zero3", "none"), (2, 1, 1, "none", "full")]  # fmt: skip
    assert all(p.num_devices == 2 for p in plans.values())
    with pytest.raises(SystemExit, match="--plans 'dp3'"):
        bench.select_plans(["dp3"], None)


def test_peak_memory_is_read_before_the_final_checkpoint_per_pipeline_rank(tmp_path):
    # two ranks, one per pipeline stage; the last step's row is written after the final checkpoint
    for rank, mems in ((0, [100, 200, 900]), (1, [150, 160, 950])):
        path = rundir.telemetry_path(tmp_path, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"rank": rank, "stage": rank, "pp": 2, "step": s, "memory_bytes": m} for s, m in enumerate(mems)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.run_peak_memory(tmp_path) == [200, 160]
