"""Stages of different widths (worker/stages.py) on real torchrun ranks reproduce the single-process
reference, like the uniform layouts of test_train_dist.py; plus the schedule's order, without ranks."""

from __future__ import annotations

import pytest

from tests.worker.test_train_dist import ADAM, ADAM_ATOL, SGD, assert_matches_reference
from worker.stages import action_order


def _hetero(make_plan, splits, widths, schedule="1f1b", shares=None, mbs=2, model="tiny", sharding="none"):
    """make_plan's plan with stage i at widths[i] = (tp, dp), ranks numbered stage after stage."""
    plan = make_plan(splits, schedule=schedule, mbs=mbs, model=model, shares=shares, sharding=sharding)
    first = 0
    for st, (tp, dp) in zip(plan["stages"], widths, strict=True):
        st["tp"], st["dp"] = tp, dp
        st["device_ids"] = list(range(first, first + tp * dp))
        first += tp * dp
    return plan, first


@pytest.mark.dist
def test_stage0_tp2_stage1_tp1_uneven_split_matches_single_process(tmp_path, torchrun, make_plan, telemetry):
    plan, nproc = _hetero(make_plan, [(0, 3), (3, 4)], [(2, 1), (1, 1)])
    torchrun(tmp_path, plan, nproc, "--steps", "3", *SGD)
    assert_matches_reference(tmp_path, "tiny", 3)
    rows = telemetry(tmp_path)
    assert {(r["rank"], r["stage"], r["tp"], r["tp_index"]) for r in rows} == {(0, 0, 2, 0), (1, 0, 2, 1), (2, 1, 1, 0)}
    assert all((r["loss"] is None) == (r["stage"] == 0) for r in rows)


@pytest.mark.dist
def test_stage0_tp1_stage1_tp2_gpipe_llama_matches_single_process(tmp_path, torchrun, make_plan):
    """The other direction (one leader broadcasts to a wider stage), GQA heads, and GPipe order."""
    plan, nproc = _hetero(make_plan, [(0, 1), (1, 4)], [(1, 1), (2, 1)], schedule="gpipe", model="tiny-llama")
    torchrun(tmp_path, plan, nproc, "--steps", "2", *SGD)
    assert_matches_reference(tmp_path, "tiny-llama", 2)


@pytest.mark.dist
def test_stage0_tp2_dp1_stage1_tp1_dp2_uneven_split_matches_single_process(tmp_path, torchrun, make_plan, telemetry):
    """Stage 1's two replicas each run one half of every micro-batch stage 0's tp leader sends."""
    plan, nproc = _hetero(make_plan, [(0, 3), (3, 4)], [(2, 1), (1, 2)])
    torchrun(tmp_path, plan, nproc, "--steps", "3", *SGD)
    assert_matches_reference(tmp_path, "tiny", 3)
    rows = telemetry(tmp_path)
    got = {(r["rank"], r["stage"], r["replica"], r["num_microbatches"], r["samples"]) for r in rows}
    assert got == {(0, 0, 0, 4, 8), (1, 0, 0, 4, 8), (2, 1, 0, 4, 4), (3, 1, 1, 4, 4)}


@pytest.mark.dist
def test_stage0_dp2_stage1_tp2_dp1_zero2_gpipe_matches_single_process(tmp_path, torchrun, make_plan):
    """The other direction (two replicas' halves merge into one tp2 replica), with FSDP2 on stage 0."""
    plan, nproc = _hetero(make_plan, [(0, 1), (1, 4)], [(1, 2), (2, 1)], schedule="gpipe", sharding="zero2")
    torchrun(tmp_path, plan, nproc, "--steps", "2", *SGD)
    assert_matches_reference(tmp_path, "tiny", 2)


@pytest.mark.dist
def test_a_uniform_checkpoint_resumes_into_stages_of_different_widths(tmp_path, torchrun, make_plan):
    """2 AdamW steps under pp2 (tp1 | tp1), then 2 more under tp2×dp1 | tp1×dp2: DCP reshards model
    and optimizer state into the per-stage meshes, and the result is the uninterrupted reference."""
    torchrun(tmp_path / "a", make_plan([(0, 2), (2, 4)]), 2, "--steps", "2", *ADAM)
    plan, nproc = _hetero(make_plan, [(0, 3), (3, 4)], [(2, 1), (1, 2)])
    ckpt = tmp_path / "a" / "checkpoints" / "step_00000002"
    torchrun(tmp_path / "b", plan, nproc, "--steps", "4", "--resume", str(ckpt), *ADAM)
    assert_matches_reference(tmp_path / "b", "tiny", 4, "adamw", 0.01, atol=ADAM_ATOL)


@pytest.mark.parametrize(
    ("schedule", "stage", "pp", "m", "want"),
    [
        ("gpipe", 0, 2, 2, "F0 F1 B0 B1"),
        ("1f1b", 0, 2, 3, "F0 F1 B0 F2 B1 B2"),
        ("1f1b", 1, 2, 3, "F0 B0 F1 B1 F2 B2"),
        ("1f1b", 0, 3, 1, "F0 B0"),  # fewer micro-batches than pp: a shorter warm-up
    ],
)
def test_action_order(schedule, stage, pp, m, want):
    assert " ".join(f"{a}{k}" for a, k in action_order(schedule, stage, pp, m)) == want
