"""Sequence parallelism and every-k-th-block recompute on real gloo ranks reproduce the single process.

Like tests/worker/test_train_dist.py: 2 ranks, the tiny models, SGD (linear in the gradient, so a
lost or doubled gradient term shows), every parameter compared with tests.support.reference.
"""

from __future__ import annotations

import pytest

from planner.runtime import launch_problems
from planner.specs.plan import parse_plan
from tests.worker.test_train_dist import SGD, assert_matches_reference

pytestmark = pytest.mark.dist


def test_tp2_sequence_parallel_llama_matches_single_process(tmp_path, torchrun, make_plan):
    """RMSNorms on s/2 of the sequence, attention / MLP inputs all-gathered, wo / w2 reduce-scattered;
    the norm weights' gradients (summed over the two slices) are what the check would miss first."""
    plan = make_plan([(0, 4)], tp=2, model="tiny-llama")
    plan["stages"][0]["sequence_parallel"] = True
    assert not launch_problems(parse_plan(plan))
    torchrun(tmp_path, plan, 2, "--steps", "2", *SGD)
    assert_matches_reference(tmp_path, "tiny-llama", 2)


def test_recompute_every_second_block_under_pp2_matches_single_process(tmp_path, torchrun, make_plan):
    plan = make_plan([(0, 3), (3, 4)], recompute="full")
    plan["stages"][0]["recompute_every"] = 2  # blocks 0 and 2 of stage 0 recomputed, block 1 kept
    assert not launch_problems(parse_plan(plan))
    torchrun(tmp_path, plan, 2, "--steps", "2", *SGD)
    assert_matches_reference(tmp_path, "tiny", 2)
