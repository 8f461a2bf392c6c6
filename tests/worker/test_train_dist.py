"""Real torchrun launches of worker.train: every layout reproduces the single-process reference.

Each test trains k steps under a plan on 2–4 gloo ranks, loads the final DCP checkpoint into a full
model in this process, and compares every parameter with tests.support.reference trained on the identical
global batches. SGD is used for the layout tests because its update is linear in the gradient, so a
wrong weighting (mean vs sum over replicas, shares, micro-batch scaling) shows up; AdamW (whose
g/|g| would hide a constant factor) is used where optimizer state must survive checkpoints.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from planner.specs.model import ModelSpec, get_model
from tests.support.reference import train_reference
from worker.checkpoint import checkpoint_step, latest_checkpoint, load_full_model_state

pytestmark = pytest.mark.dist

SGD = ("--data", "synthetic", "--optimizer", "sgd", "--lr", "0.5")


def assert_matches_reference(
    run_dir: Path,
    model: str | ModelSpec,
    steps: int,
    optimizer: str = "sgd",
    lr: float = 0.5,
    atol: float = 2e-5,
    data: str = "synthetic",
) -> None:
    """The run's final checkpoint equals the single-process reference's weights (`model`: a preset or dims)."""
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    plan = json.loads((run_dir / "plan.json").read_text())
    ref, _ = train_reference(spec, plan["global_batch_size"], plan["seq_len"], steps, data, 0, lr, optimizer)  # type: ignore[arg-type]
    init, _ = train_reference(spec, plan["global_batch_size"], plan["seq_len"], 0)
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None and checkpoint_step(ckpt) == steps
    got = load_full_model_state(ckpt, spec)
    assert set(got) == set(ref)
    worst = max((got[k] - ref[k]).abs().max().item() for k in ref)
    moved = max((ref[k] - init[k]).abs().max().item() for k in ref)
    assert moved > 50 * atol, "training must move the weights, or the comparison proves nothing"
    assert worst < atol, f"max |param - reference| = {worst:.3g} (weights moved up to {moved:.3g})"


def test_pp2_uneven_split_matches_single_process(tmp_path, torchrun, make_plan, telemetry):
    plan = make_plan([(0, 1), (1, 4)], schedule="gpipe")
    torchrun(tmp_path, plan, 2, "--steps", "3", *SGD)
    assert_matches_reference(tmp_path, "tiny", 3)
    rows = telemetry(tmp_path)
    assert {(r["rank"], r["stage"]) for r in rows} == {(0, 0), (1, 1)}
    assert all((r["loss"] is None) == (r["stage"] == 0) for r in rows)


def test_devices_out_of_pipeline_order_launch_and_match_single_process(tmp_path, torchrun, make_plan, telemetry):
    """The plan names cluster devices 5 and 2 (a later stage on a lower id): ranks follow the rank map."""
    plan = make_plan([(0, 1), (1, 4)], schedule="gpipe")
    plan["stages"][0]["device_ids"], plan["stages"][1]["device_ids"] = [5], [2]
    torchrun(tmp_path, plan, 2, "--steps", "2", *SGD)
    assert_matches_reference(tmp_path, "tiny", 2)
    assert {(r["rank"], r["stage"]) for r in telemetry(tmp_path)} == {(0, 0), (1, 1)}


def test_pp2_dp2_matches_single_process(tmp_path, torchrun, make_plan):
    torchrun(tmp_path, make_plan([(0, 3), (3, 4)], dp=2), 4, "--steps", "2", *SGD)
    assert_matches_reference(tmp_path, "tiny", 2)


def test_tp2_pp2_llama_matches_single_process(tmp_path, torchrun, make_plan):
    plan = make_plan([(0, 2), (2, 4)], tp=2, model="tiny-llama")
    torchrun(tmp_path, plan, 4, "--steps", "2", *SGD)
    assert_matches_reference(tmp_path, "tiny-llama", 2)


def test_fsdp_zero3_with_recompute_matches_single_process(tmp_path, torchrun, make_plan):
    plan = make_plan([(0, 4)], dp=2, sharding="zero3", recompute="full")
    torchrun(tmp_path, plan, 2, "--steps", "2", *SGD)
    assert_matches_reference(tmp_path, "tiny", 2)


def test_unequal_batch_shares_weight_gradients_by_share(tmp_path, torchrun, make_plan, telemetry):
    plan = make_plan([(0, 4)], dp=2, shares=[6, 2], recompute="selective")  # recompute: free extra coverage
    torchrun(tmp_path, plan, 2, "--steps", "2", *SGD)
    assert_matches_reference(tmp_path, "tiny", 2)
    mbs = {r["replica"]: (r["num_microbatches"], r["samples"]) for r in telemetry(tmp_path)}
    assert mbs == {0: (3, 6), 1: (1, 2)}


ADAM = ("--data", "synthetic", "--optimizer", "adamw", "--lr", "0.01")
ADAM_ATOL = 5e-4


@pytest.fixture(scope="module")
def two_step_checkpoint(tmp_path_factory, torchrun, make_plan):
    """2 AdamW steps under FSDP zero2 (dp=2), checkpointed at step 2; a copy per test resumes from it."""
    run_dir = tmp_path_factory.mktemp("ckpt-run")
    torchrun(run_dir, make_plan([(0, 4)], dp=2, sharding="zero2"), 2, "--steps", "2", *ADAM)
    return run_dir


def test_resume_same_plan_continues_data_and_optimizer(two_step_checkpoint, tmp_path, torchrun):
    run_dir = tmp_path / "run"
    shutil.copytree(two_step_checkpoint, run_dir)
    plan = json.loads((run_dir / "plan.json").read_text())
    proc = torchrun(run_dir, plan, 2, "--steps", "4", *ADAM)
    assert "step 2 loss" in proc.stdout and "step 0 loss" not in proc.stdout  # resumed, did not restart
    assert_matches_reference(run_dir, "tiny", 4, "adamw", 0.01, atol=ADAM_ATOL)


def test_adam_tolerance_would_catch_a_lost_optimizer_state():
    """AdamW's update g/(|g|+eps) amplifies fp noise (hence ADAM_ATOL), yet losing its state is far larger."""
    spec = get_model("tiny")
    kept, _ = train_reference(spec, 8, 32, 4, "synthetic", 0, 0.01, "adamw")
    at2, _ = train_reference(spec, 8, 32, 2, "synthetic", 0, 0.01, "adamw")
    lost, _ = train_reference(spec, 8, 32, 4, "synthetic", 0, 0.01, "adamw", start=(2, at2))
    assert max((kept[k] - lost[k]).abs().max().item() for k in kept) > 10 * ADAM_ATOL


def test_resume_into_different_plan_reshards(two_step_checkpoint, tmp_path, torchrun, make_plan, telemetry):
    """Saved under dp=2 zero2; resumed under pp=2 interleaved 1F1B (2 virtual stages per rank)."""
    ckpt = two_step_checkpoint / "checkpoints" / "step_00000002"
    plan = make_plan([(0, 1), (1, 2), (2, 3), (3, 4)], schedule="interleaved-1f1b", virtual_stages=2)
    torchrun(tmp_path, plan, 2, "--steps", "4", "--resume", str(ckpt), *ADAM)
    spec = get_model("tiny")
    _, ref_losses = train_reference(spec, 8, 32, 4, "synthetic", 0, 0.01, "adamw")
    first = [r for r in telemetry(tmp_path) if r["loss"] is not None and r["step"] == 2]
    assert first, "the resumed run must start at step 2"
    assert first[0]["loss"] == pytest.approx(ref_losses[2], abs=1e-5)
    assert_matches_reference(tmp_path, "tiny", 4, "adamw", 0.01, atol=ADAM_ATOL)


def test_killed_rank_is_restarted_and_resumes_from_the_checkpoint(tmp_path, torchrun, make_plan, telemetry):
    """Rank 1 is SIGKILLed at step 3 (after the step-2 checkpoint); torchrun restarts both ranks once,
    they re-rendezvous under a fresh store prefix and finish — with the same weights as no crash."""
    from planner.specs.faults import FaultSpec
    from planner.specs.plan import parse_plan
    from storage.runs import (
        events_of,
        finish_run,
        ingest_step_metrics,
        load_run,
        record_run_events,
        resume_records,
        run_events,
        start_run,
    )

    kill = FaultSpec(kill_rank=1, kill_step=3).to_arg()
    plan = make_plan([(0, 2), (2, 4)])
    torchrun(
        tmp_path,
        plan,
        2,
        "--steps",
        "4",
        "--checkpoint-every",
        "2",
        *SGD,
        "--faults",
        kill,
        launcher_args=("--max-restarts", "1"),
    )
    assert_matches_reference(tmp_path, "tiny", 4)
    rows = telemetry(tmp_path)
    assert {(r["attempt"], r["step"]) for r in rows if r["rank"] == 1} == {(0, 0), (0, 1), (0, 2), (1, 2), (1, 3)}
    db = tmp_path / "m.duckdb"
    start_run(db, "crash", parse_plan(plan), 4, tmp_path)
    assert ingest_step_metrics(db, "crash", tmp_path) == 2 * 4
    finish_run(db, "crash", "completed")
    assert load_run(db, "crash")["restarts"] == 1
    # the restart and its resume are events on the run, not only a restart count
    record_run_events(db, "crash", events_of(resume_records(tmp_path)))
    ckpt2 = str(tmp_path / "checkpoints" / "step_00000002")
    assert [(e["kind"], e["attempt"], e["step"], e["checkpoint"]) for e in run_events(db, "crash")] == [
        ("restart", 1, None, None),
        ("resume", 1, 2, ckpt2),
    ]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> str:
    """The shipped corpus tokenized by `meshplan data prepare`'s code with a 256-id BPE (the tiny preset's vocabulary)."""
    tokenizers = pytest.importorskip("tokenizers")
    from storage.dataset import prepare

    root = Path(__file__).resolve().parents[2]
    d = tmp_path_factory.mktemp("prepared")
    docs = [line for line in (root / "worker/data/corpus.txt").read_text().splitlines() if line.strip()]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=256, special_tokens=["<|endoftext|>"], show_progress=False, initial_alphabet=[]
    )
    tok.train_from_iterator(docs, trainer)
    tok.save(str(d / "tokenizer.json"))
    (d / "docs.txt").write_text("\n".join(docs))
    prepare([d / "docs.txt"], d / "tokenizer.json", d / "ds", val_fraction=0.0)
    return str(d / "ds")


def test_prepared_data_killed_and_resumed_then_replanned_reads_the_uninterrupted_runs_tokens(
    tmp_path, torchrun, make_plan, prepared
):
    """A rank SIGKILLed at step 3 of a pp2 run restarts from the step-2 checkpoint; that run's step-4
    checkpoint then resumes under a dp2 plan (unequal batch shares 2 + 6) to step 6: the weights equal one
    process trained 6 steps on the same prepared tokens, so every launch read exactly its tokens."""
    from planner.specs.faults import FaultSpec

    data = ("--data", prepared, "--optimizer", "sgd", "--lr", "0.5")
    kill = FaultSpec(kill_rank=1, kill_step=3).to_arg()
    first = tmp_path / "pp2"
    torchrun(
        first, make_plan([(0, 2), (2, 4)]), 2, "--steps", "4", "--checkpoint-every", "2", *data, "--faults", kill,
        launcher_args=("--max-restarts", "1"),
    )  # fmt: skip
    assert_matches_reference(first, "tiny", 4, data=prepared)
    second = tmp_path / "dp2"
    torchrun(
        second, make_plan([(0, 4)], dp=2, shares=[2, 6]), 2, "--steps", "6", *data,
        "--resume", str(first / "checkpoints" / "step_00000004"),
    )  # fmt: skip
    assert_matches_reference(second, "tiny", 6, data=prepared)
