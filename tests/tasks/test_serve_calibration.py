"""tasks.serve.read_calibration: the per-stage files tp rank 0 of each serving stage writes, read into
the cost model's calibration (device kind, model, pp, tp, batch) → seconds per stage."""

import json

import pytest

from planner.serve.placement import Placement
from tasks.serve import read_calibration

DIMS = {"num_layers": 2, "hidden": 64, "num_heads": 4, "vocab_size": 256, "seq_len": 32}


def test_groups_of_one_layout_pool_their_served_requests_and_idle_stages_keep_startup_times(tmp_path) -> None:
    models = [{"name": n, "dims": {"name": n, **DIMS}, "slo_s": 1.0} for n in ("a", "b")]
    groups = [
        {"devices": [0, 1], "kind": "cpu", "pp": 2, "tp": 1, "models": ["a", "b"]},
        {"devices": [2, 3], "kind": "cpu", "pp": 2, "tp": 1, "models": ["a"]},
        {"devices": [4, 5], "kind": "cpu", "pp": 1, "tp": 2, "models": ["b"]},
    ]
    pl = Placement.model_validate({"method": "manual", "cluster": "c", "models": models, "groups": groups})

    def write(kind: str, rank: int, group: int, stage: int, **data) -> None:
        (tmp_path / f"{kind}_rank{rank}.json").write_text(json.dumps({"group": group, "stage": stage, **data}))

    for rank, (group, stage) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        write("calib", rank, group, stage, stage_s={"a": 9.0, "b": 7.0} if group == 0 else {"a": 8.0})
    write("calib", 4, 2, 0, stage_s={"b": 5.0})  # tp rank 0 of group 2 only
    req = [{"id": i, "model": "a", "compute_s": t} for i, t in enumerate((1.0, 2.0))]
    write("stage", 0, 0, 0, requests=req[:1])
    write("stage", 1, 0, 1, requests=[dict(req[0], compute_s=3.0)])
    write("stage", 2, 1, 0, requests=req[1:])
    write("stage", 3, 1, 1, requests=[])  # group 1's last stage logged nothing: pooled with group 0's
    write("stage", 4, 2, 0, requests=[{"id": 5, "model": "b", "compute_s": 0.5}])
    calib = read_calibration(tmp_path, pl)
    assert calib == {
        ("cpu", "a", 2, 1, 1): (pytest.approx(1.5), 3.0),
        ("cpu", "b", 2, 1, 1): (7.0, 7.0),  # served nothing: its start-up times
        ("cpu", "b", 1, 2, 1): (0.5,),
    }


def test_groups_of_one_layout_on_different_device_kinds_keep_their_own_figures(tmp_path) -> None:
    models = [{"name": "a", "dims": {"name": "a", **DIMS}, "slo_s": 1.0}]
    groups = [
        {"devices": [0], "kind": "cpu", "pp": 1, "tp": 1, "models": ["a"]},
        {"devices": [1], "kind": "cpu", "pp": 1, "tp": 1, "models": ["a"]},
        {"devices": [2], "kind": "V100-SXM2-32GB", "pp": 1, "tp": 1, "models": ["a"]},
    ]
    pl = Placement.model_validate({"method": "manual", "cluster": "c", "models": models, "groups": groups})
    for rank, t in enumerate((4.0, 2.0, 0.5)):
        (tmp_path / f"calib_rank{rank}.json").write_text(json.dumps({"group": rank, "stage": 0, "stage_s": {"a": t}}))
    assert read_calibration(tmp_path, pl) == {("cpu", "a", 1, 1, 1): (3.0,), ("V100-SXM2-32GB", "a", 1, 1, 1): (0.5,)}


def test_serving_figures_are_stored_per_run_and_device_kind_and_pooled_into_the_next_plan(tmp_path) -> None:
    """The serve flow stores each run's fitted figures per device kind (storage/serve.save_serving);
    serve-plan pools every run's figures of a kind, weighted by their requests, into its cost model."""
    from planner.serve.cost import KindServing
    from planner.serve.workload import ServedModel, Workload
    from planner.specs.cluster import parse_cluster
    from storage.serve import load_serving, save_serving
    from tasks.serve import plan_placements

    db = tmp_path / "meshplan.duckdb"
    assert load_serving(db) == {}  # no store yet: the cost model's defaults
    one = {"cpu": KindServing(0.010, 0.002, 0.001, 0.2), "T4": KindServing(1, 1, 1, 1)}
    assert save_serving(db, "r1", one, {"cpu": 100}) == 1
    save_serving(db, "r2", {"cpu": KindServing(0.030, 0.004, 0.003, 0.4)}, {"cpu": 300})
    save_serving(db, "r3", {"V100": KindServing(0.005, 0.001, 0.0, 0.1)}, {"V100": 50})
    got = load_serving(db)
    assert set(got) == {"cpu", "V100"}  # T4 measured no request in r1: nothing stored for it
    cpu, runs, reqs = got["cpu"]
    assert (runs, reqs) == (2, 400)
    assert cpu.front_s == pytest.approx(0.025) and cpu.reply_s == pytest.approx(0.0035)
    assert cpu.handoff_s == pytest.approx(0.0025) and cpu.tp_serial == pytest.approx(0.35)
    assert got["V100"][0] == KindServing(0.005, 0.001, 0.0, 0.1)  # another kind keeps its own

    cluster = parse_cluster(
        {
            "name": "cpu-2",
            "nodes": [
                {
                    "name": "cpu",
                    "device": "cpu",
                    "num_devices": 2,
                    "intra_link": "eth-100g",
                    "inter_link": "eth-100g",
                    "device_memory_bytes": 8_000_000_000,
                    "device_peak_flop_per_s": 50_000_000_000,
                }
            ],
        }
    )
    dims = {"name": "a", **DIMS}
    w = Workload(models=(ServedModel(name="a", dims=dims, rate=5, slo_s=0.05),), duration_s=20)
    plain = plan_placements.fn(w, cluster)["meshplan"]
    # a front end and reply that take the whole 50 ms budget: the plan's prediction sees them
    slow = plan_placements.fn(w, cluster, {"cpu": KindServing(0.049, 0.002, 0.0, 0.0)})["meshplan"]
    assert plain.attainment == pytest.approx(1.0) and slow.attainment < 0.5
