"""A plan this machine cannot hold is refused before any rank starts (issue #36): one line naming
--plan, what it needs and what the machine has, pointing at --dry-run; no run row, no run folder.
(The tour's 16-device gpt3-13b plan used to start 16 full-size ranks and be OOM-killed.)"""

from __future__ import annotations

import json

import pytest

from flows.requests import TrainRequest
from flows.train import prepare_launch
from launcher.host import local_capacity
from planner.errors import MeshplanError
from planner.runtime import machine_problem
from planner.specs.model import get_model
from planner.specs.plan import parse_plan
from planner.specs.runspec import RunSpec


def _plan(model: str, layers: int, devices: int, dtype: str = "bf16") -> dict:
    return {
        "model": model,
        "cluster": "cpu",
        "global_batch_size": 4 * devices,
        "seq_len": 32,
        "micro_batch_size": 1,
        "dtype": dtype,
        "batch_shares": [4] * devices,
        "stages": [{"layer_start": 0, "layer_end": layers, "device_ids": list(range(devices)), "dp": devices}],
    }


def test_a_13b_plan_is_refused_on_this_machine_before_anything_is_written(tmp_path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan("gpt3-13b", 40, 2)))
    db = tmp_path / "m.duckdb"
    with pytest.raises(MeshplanError) as exc:
        prepare_launch(
            str(db), TrainRequest(plan_path=str(plan), spec=RunSpec(steps=1), runs_dir=str(tmp_path / "runs"))
        )
    line = str(exc.value)
    assert "--plan" in line and "GB available" in line and "--dry-run" in line and "\n" not in line, line
    assert not (tmp_path / "runs").exists() and not db.exists()


def test_memory_and_gpu_counts_decide() -> None:
    p = parse_plan(_plan("tiny", 4, 2, "fp32"))
    tiny, big = get_model("tiny"), get_model("gpt3-13b")
    assert machine_problem(p, tiny, 2, 0, 1 << 30) is None
    need = big.num_params() * 2 * 2  # bf16 weights + gradients
    p13 = parse_plan(_plan("gpt3-13b", 40, 2))
    assert machine_problem(p13, big, 2, 0, need + 1) is None
    assert "GB available" in machine_problem(p13, big, 2, 0, need - 1)
    assert "has 1 GPU(s)" in machine_problem(p13, big, 2, 1, None)
    assert machine_problem(p13, big, 1, 1, None) is None
    gpus, mem = local_capacity()
    assert gpus >= 0 and (mem is None or mem > 0)


def test_a_plan_on_some_devices_of_a_bigger_cluster_launches_and_a_wrong_node_shape_names_the_right_one(tmp_path):
    """What `plan` gives after `discover --executor slurm --nodes 2` (2 ranks a node) may use devices
    [0, 2, 3]: it launches on 3 ranks; `--nnodes 2` cannot split 3, and train says which shapes can."""
    plan = tmp_path / "plan.json"
    doc = _plan("tiny", 4, 3, "fp32")
    doc["stages"][0]["device_ids"] = [0, 2, 3]
    plan.write_text(json.dumps(doc))
    db = str(tmp_path / "m.duckdb")
    got, _, launch = prepare_launch(db, TrainRequest(plan_path=str(plan), spec=RunSpec(steps=1)), "r1")
    assert got.stages[0].device_ids == (0, 1, 2) and launch.nproc_per_node == 3
    with pytest.raises(MeshplanError) as exc:
        prepare_launch(db, TrainRequest(plan_path=str(plan), spec=RunSpec(steps=1), nnodes=2), "r2")
    assert "--nnodes 1 --nproc-per-node 3 or --nnodes 3 --nproc-per-node 1" in str(exc.value), str(exc.value)
