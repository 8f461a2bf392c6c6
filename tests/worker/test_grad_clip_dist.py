"""`grad_clip_norm`: the ranks clip by the norm of the whole model's gradient (worker/clip.py), so a
plan that splits the model trains exactly as one process that clips by hand (tests/support/reference.py).

The tiny model's gradient norm is ~1.5 at step 0 and ~0.55 at step 1 (SGD, lr 0.5), so a 0.4 clip
acts on every step; under pp each stage holds part of the gradient, and under FSDP each rank a shard
(a DTensor): clipping by a rank's own norm would scale each part differently and miss the reference.
"""

from __future__ import annotations

import json

import pytest

from planner.specs.model import get_model
from tests.support.reference import train_reference
from worker.checkpoint import checkpoint_step, latest_checkpoint, load_full_model_state

pytestmark = pytest.mark.dist

CLIP = 0.4
SGD = ("--data", "synthetic", "--optimizer", "sgd", "--lr", "0.5", "--grad-clip-norm", str(CLIP))
ATOL = 2e-5


def _worst(run_dir, steps: int, clip: float) -> float:
    spec = get_model("tiny")
    plan = json.loads((run_dir / "plan.json").read_text())
    ref, _ = train_reference(spec, plan["global_batch_size"], plan["seq_len"], steps, grad_clip_norm=clip, lr=0.5)
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None and checkpoint_step(ckpt) == steps
    got = load_full_model_state(ckpt, spec)
    return max((got[k] - ref[k]).abs().max().item() for k in ref)


def test_one_process_clips_like_the_hand_computed_step(tmp_path, torchrun, make_plan):
    spec = get_model("tiny")
    clipped, _ = train_reference(spec, 8, 32, 2, lr=0.5, grad_clip_norm=CLIP)
    plain, _ = train_reference(spec, 8, 32, 2, lr=0.5)
    assert max((clipped[k] - plain[k]).abs().max().item() for k in plain) > 100 * ATOL  # the clip acts
    torchrun(tmp_path, make_plan([(0, 4)]), 1, "--steps", "2", *SGD)
    assert _worst(tmp_path, 2, CLIP) < ATOL


@pytest.mark.parametrize(
    ("splits", "kw"),
    [([(0, 1), (1, 4)], {"schedule": "gpipe"}), ([(0, 4)], {"dp": 2, "sharding": "zero3"})],
    ids=["pp2", "fsdp-zero3-dp2"],
)
def test_two_ranks_clip_by_the_whole_models_norm(tmp_path, torchrun, make_plan, splits, kw):
    torchrun(tmp_path, make_plan(splits, **kw), 2, "--steps", "2", *SGD)
    assert _worst(tmp_path, 2, CLIP) < ATOL
