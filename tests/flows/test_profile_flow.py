"""Real Prefect runs of the profile flow on the tiny model (shapes kept tiny: the machine has 2 cores)."""

from pathlib import Path

import pytest

from cli.commands.profile import grid_values
from flows.outcomes import KindEfficiency, ProfileOutcome
from flows.profile import profile_flow
from planner.errors import MeshplanError
from planner.measure.profiles import DEFAULT_EFFICIENCY
from planner.specs.config import ProfileConfig
from planner.specs.model import PRESETS
from storage.profiles import load_profile_table, profile_frame

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "mixed-a100-v100-t4.toml"
TINY = ProfileConfig(mbs=(1,), seq=(16,), tp=(1,), repeats=2, min_block_s=0.002, recompute=(False,))


def _profile(db: str, comm: bool = False, **kw) -> ProfileOutcome:
    """profile_flow on the tiny model with TINY's section, `kw`'s profile fields changed."""
    fields = {k: v for k, v in kw.items() if k in ProfileConfig.model_fields}
    flow_args = {k: v for k, v in kw.items() if k not in fields}
    cfg = TINY.model_copy(update=fields)
    return profile_flow(db_path=db, model_name="tiny", profile=cfg, comm=comm, **flow_args)


def test_second_run_measures_nothing_and_keeps_the_first_measurements(tmp_path):
    db, run_dir = str(tmp_path / "m.duckdb"), str(tmp_path / "runs")
    first = _profile(db, run_dir=run_dir, recompute=(False, True))
    assert (first.measured, first.reused, first.profiler_runs) == (6, 0, 1)  # 3 layer kinds x 2 recompute
    before = profile_frame(db).select("layer_kind", "recompute", "measured_at").sort("layer_kind", "recompute")
    assert len(list(Path(run_dir).glob("*.jsonl"))) == 1

    second = _profile(db, run_dir=run_dir, recompute=(False, True))
    assert (second.measured, second.reused, second.profiler_runs) == (0, 6, 0)
    after = profile_frame(db).select("layer_kind", "recompute", "measured_at").sort("layer_kind", "recompute")
    assert after.equals(before)
    table = load_profile_table(db, PRESETS["tiny"], ["cpu"])
    assert len(table) == 6 and not any(r.estimated for r in table)


def test_cluster_file_yields_estimated_gpu_rows_flagged_with_their_efficiency(tmp_path):
    db = str(tmp_path / "m.duckdb")
    out = _profile(db, cluster_file=str(CLUSTER), comm=True)
    assert out.measured == 0 and out.profiler_runs == 0  # no CPU in that cluster: nothing to measure here
    assert out.estimated == 3 * 3  # A100, V100, T4 x embedding, block, head
    # Only a CPU could have been measured here, which says nothing about tensor cores: default efficiency.
    assert out.efficiency["A100-SXM4-40GB"] == KindEfficiency(efficiency=DEFAULT_EFFICIENCY, source="default")
    a100 = profile_frame(db).filter(device_kind="A100-SXM4-40GB")
    assert a100.height == 3 and a100["estimated"].all() and (a100["efficiency"] == DEFAULT_EFFICIENCY).all()
    assert set(a100["dtype"]) == {"bf16"}
    fits = {(f["link_kind"], f["op"]) for f in out.comm_fits}
    assert {("nvlink3", "send_recv"), ("eth-100g", "send_recv")} <= fits


def test_flow_rejects_a_tp_that_does_not_divide_the_heads(tmp_path):
    with pytest.raises(MeshplanError, match="profile.tp"):
        _profile(str(tmp_path / "m.duckdb"), tp=(3,))


def test_cli_grid_options_accept_spaces_commas_and_repeats():
    tokens = "--model tiny --mbs 1 2 --tp 1,2 --seq=32 --mbs 4 --json".split()
    assert grid_values(tokens, "--mbs") == [1, 2, 4]
    assert grid_values(tokens, "--tp") == [1, 2]
    assert grid_values(tokens, "--seq") == [32]
    with pytest.raises(MeshplanError, match="--mbs"):
        grid_values(["--mbs", "1,x"], "--mbs")


def test_tp_blocks_are_timed_on_a_real_tp_group_and_priced_without_a_second_all_reduce(tmp_path):
    """tp=2 on this machine (≥ 2 cores): the profiler runs as 2 gloo ranks under torchrun and times the
    DTensor block on that group, all-reduces included; the cost model then adds none of its own."""
    from planner.cost.devices import Link
    from planner.cost.stage import StageContext, stage_coeffs

    db, run_dir = str(tmp_path / "m.duckdb"), str(tmp_path / "runs")
    out = _profile(db, run_dir=run_dir, tp=(2,))
    assert out.measured == 3 and out.profiler_runs == 1
    rows = profile_frame(db).sort("layer_kind")
    assert rows.height == 3, "one row per shape: only rank 0 of the group writes"
    assert rows["timing_method"].str.contains("real group of 2 ranks").all()
    assert dict(zip(rows["layer_kind"], rows["tp_comm_included"], strict=True)) == {
        "block": True,
        "embedding": False,
        "head": False,
    }
    table = load_profile_table(db, PRESETS["tiny"], ["cpu"])
    block = next(r for r in table if r.key.layer_kind == "block")
    assert block.tp_comm_included and block.forward_s > 0 and block.backward_s > 0
    link = Link(bandwidth_bytes_per_s=1e9, latency_s=1e-4)
    ctx = StageContext("cpu", "fp32", 1, 16, 2, False, True, True, 1, "none", 1, 1.0, 1e10, link, link, None, 2)
    coeffs = stage_coeffs(ctx, PRESETS["tiny"], table)
    assert coeffs.tp_comm_s_per_block == 0 and coeffs.compute_s_per_block == block.train_s
    assert coeffs.tp_comm_s_fixed > 0  # embedding and head were timed alone: their all-reduces are still priced


def test_optimizer_step_per_parameter_is_measured_once_per_layout_on_real_ranks_and_stored(tmp_path):
    """On a CPU the flow also times torch AdamW per parameter for plain, tensor-parallel and
    FSDP2-sharded parameters, after the layers, on 2 real gloo ranks stepping at once where the
    machine has 2 cores (torchrun); a second run finds the rows and measures nothing."""
    import os

    from storage.db import connect

    db, run_dir = str(tmp_path / "m.duckdb"), str(tmp_path / "runs")
    first = _profile(db, run_dir=run_dir)
    assert first.optimizer_measured == 1 and first.failed == []
    ranks = min(2, len(os.sched_getaffinity(0)))
    assert first.optimizer.pop("num_ranks") == ranks
    assert set(first.optimizer) == {"plain", "tp", "fsdp"}
    # ~1e-8 s (plain) and ~3e-8 s (DTensor) per parameter here; 10 µs per parameter would be absurd.
    assert all(0 < s < 1e-5 for s in first.optimizer.values()), first.optimizer
    with connect(db) as con:
        rows = con.execute(
            "SELECT layout, num_ranks, device_kind, torch_version, optimizer, s_per_param "
            "FROM optimizer_steps ORDER BY layout"
        ).fetchall()
    assert [r[:5] for r in rows] == [
        (layout, ranks, "cpu", first.torch_version, "adamw") for layout in ("fsdp", "plain", "tp")
    ]
    assert {r[0]: r[5] for r in rows} == first.optimizer

    second = _profile(db, run_dir=run_dir)
    assert second.optimizer_measured == 0 and second.measured == 0
    second.optimizer.pop("num_ranks")
    assert second.optimizer == first.optimizer
