"""Damaged checkpoints are detected and the previous valid one is used; a crash mid-save is ignored.

One real 2-rank run (pp=2, SGD, checkpoints at steps 2 and 4) provides the folders; each test damages
a copy the way disks and crashes do (bit flips, truncation, garbage metadata, a leftover
`.tmp_step_*`) and checks the integrity check names the damage and resuming falls back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from planner.errors import MeshplanError
from planner.specs.model import get_model
from storage.runs import events_of, resume_records
from tests.support.reference import train_reference
from worker.checkpoint import load_full_model_state, resume_from
from worker.checkpoint_check import CorruptCheckpointError, newest_valid, problem

pytestmark = pytest.mark.dist

SGD = ("--data", "synthetic", "--optimizer", "sgd", "--lr", "0.5")
STEP2, STEP4 = "step_00000002", "step_00000004"


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, torchrun, make_plan) -> Path:
    run_dir = tmp_path_factory.mktemp("ckpt-faults")
    torchrun(run_dir, make_plan([(0, 2), (2, 4)]), 2, "--steps", "4", "--checkpoint-every", "2", *SGD)
    return run_dir


@pytest.fixture
def run_copy(saved_run, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(saved_run, dst)
    return dst


def _flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 16] = bytes(b ^ 0xFF for b in data[mid : mid + 16])  # same size: only the digest sees it
    path.write_bytes(bytes(data))


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_saved_checkpoints_carry_digests_and_pass(saved_run):
    meta = json.loads((saved_run / "checkpoints" / STEP4 / "meta.json").read_text())
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(meta["files"])
    assert all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in meta["files"].values())
    assert problem(saved_run / "checkpoints" / STEP4) is None


def test_corrupt_newest_checkpoint_resumes_from_the_previous_one(run_copy, torchrun, make_plan):
    ckpts = run_copy / "checkpoints"
    _flip_bytes(ckpts / STEP4 / "__1_0.distcp")
    # a save killed before its rename leaves a newer, complete-looking folder behind: never a candidate
    shutil.copytree(ckpts / STEP4, ckpts / ".tmp_step_00000006")
    (ckpts / ".tmp_step_00000006" / "meta.json").unlink()
    spec = get_model("tiny")
    at2 = load_full_model_state(ckpts / STEP2, spec)
    ref2, _ = train_reference(spec, 8, 32, 2, "synthetic", 0, 0.5, "sgd")
    assert _max_diff(at2, ref2) < 2e-5  # the fallback target really is the step-2 state

    proc = torchrun(
        run_copy, json.loads((run_copy / "plan.json").read_text()), 2, "--steps", "4", "--checkpoint-every", "2", *SGD
    )
    assert f"skipping {ckpts / STEP4}: __1_0.distcp sha256" in proc.stderr
    assert f"resuming from {ckpts / STEP2}" in proc.stderr
    record = json.loads((run_copy / "resume.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 2 and record["checkpoint"] == str(ckpts / STEP2)
    assert [r["checkpoint"] for r in record["rejected"]] == [str(ckpts / STEP4)]
    events = events_of(resume_records(run_copy))  # what the flow stores on the run and prints
    assert [(e["kind"], e["checkpoint"]) for e in events[-2:]] == [
        ("fallback", str(ckpts / STEP4)),
        ("resume", str(ckpts / STEP2)),
    ]
    assert "step 2 loss" in proc.stdout and "step 0 loss" not in proc.stdout  # resumed at 2, not from scratch
    # steps 2..3 re-run from the step-2 state reproduce the uninterrupted reference; garbage would not
    ref4, _ = train_reference(spec, 8, 32, 4, "synthetic", 0, 0.5, "sgd")
    assert problem(ckpts / STEP4) is None  # re-saved whole
    got = load_full_model_state(ckpts / STEP4, spec)
    assert _max_diff(got, ref4) < 2e-5 and _max_diff(ref4, ref2) > 1e-3


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("truncate_shard", "__0_0.distcp has"),
        ("flip_shard", "__0_0.distcp sha256"),
        ("garbage_metadata", ".metadata unreadable"),
        ("no_meta_json", "meta.json unreadable"),
        ("missing_shard", "__1_0.distcp is missing"),
    ],
)
def test_each_kind_of_damage_is_named_and_the_previous_checkpoint_chosen(run_copy, damage, reason):
    ckpts = run_copy / "checkpoints"
    folder = ckpts / STEP4
    shard = folder / "__0_0.distcp"
    if damage == "truncate_shard":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "flip_shard":
        _flip_bytes(shard)
    elif damage == "garbage_metadata":
        md = folder / ".metadata"
        md.write_bytes(b"\x00" * md.stat().st_size)
    elif damage == "no_meta_json":
        (folder / "meta.json").unlink()
    else:
        (folder / "__1_0.distcp").unlink()
    assert reason in (problem(folder) or "")
    chosen, rejected = newest_valid(ckpts)
    assert chosen == ckpts / STEP2 and rejected == [{"checkpoint": str(folder), "reason": problem(folder)}]
    with pytest.raises(CorruptCheckpointError, match=reason.split()[0]):
        load_full_model_state(folder, get_model("tiny"))


def test_truncation_is_caught_without_digests(run_copy):
    """A checkpoint from before digests existed is still checked against its own .metadata."""
    folder = run_copy / "checkpoints" / STEP4
    meta = json.loads((folder / "meta.json").read_text())
    del meta["files"]
    (folder / "meta.json").write_text(json.dumps(meta))
    assert problem(folder) is None
    shard = folder / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    assert "points past the end of __1_0.distcp" in (problem(folder) or "")


def test_leftover_tmp_and_a_lost_marker_never_pick_a_partial_save(run_copy):
    ckpts = run_copy / "checkpoints"
    shutil.copytree(ckpts / STEP4, ckpts / ".tmp_step_00000006")
    shutil.copytree(ckpts / STEP4, ckpts / ".old_step_00000008")
    (ckpts / "latest").unlink()  # a crash between the folder rename and the marker replace
    assert newest_valid(ckpts) == (ckpts / STEP4, [])
    (ckpts / "latest").write_text(STEP2)  # the marker bounds the timeline: step 4 is an abandoned branch
    assert newest_valid(ckpts) == (ckpts / STEP2, [])


def test_all_checkpoints_unreadable_stops_the_run_unless_fresh_start(run_copy):
    """Garbage meta.json everywhere: "auto" refuses (naming the folder and --fresh-start) and records
    why; "fresh-start" starts from step 0 and records that it did."""
    ckpts = run_copy / "checkpoints"
    for meta in ckpts.glob("step_*/meta.json"):
        meta.write_text("\x00garbage")
    with pytest.raises(MeshplanError, match="all 2 checkpoints are unreadable") as err:
        resume_from("auto", run_copy)
    assert str(ckpts) in str(err.value) and "--fresh-start" in str(err.value)
    assert resume_records(run_copy)[-1]["error"] == str(err.value)
    assert resume_from("fresh-start", run_copy) is None
    last = resume_records(run_copy)[-1]
    assert last["fresh_start"] and last["step"] == 0 and len(last["rejected"]) == 2
    assert [e["kind"] for e in events_of([last])] == ["fallback", "fallback", "fresh_start"]
    (ckpts / STEP2 / "meta.json").unlink()  # a run with no checkpoint at all still starts quietly at 0
    for folder in ckpts.glob("step_*"):
        shutil.rmtree(folder)
    assert resume_from("auto", run_copy) is None
