"""Context parallelism on real gloo ranks reproduces the single process (worker/cp.py).

Like tests/worker/test_train_sp.py: 2 ranks, the tiny models, SGD (linear in the gradient, so a lost
or doubled gradient term shows), every parameter compared with tests.support.reference. Each rank
runs 16 of the 32 tokens (chunks 0+3 and 1+2 of 4), all-gathers k and v in every attention layer.
"""

from __future__ import annotations

import pytest

from planner.runtime import launch_problems
from planner.specs.plan import parse_plan
from tests.worker.test_train_dist import SGD, assert_matches_reference

pytestmark = pytest.mark.dist


def cp2(make_plan, model: str, **kw) -> dict:
    plan = make_plan([(0, 4)], model=model, **kw)
    plan["stages"][0].update(cp=2, device_ids=[0, 1])
    assert not launch_problems(parse_plan(plan), 2)
    return plan


def test_cp2_gpt_with_learned_positions_and_zero3_matches_single_process(tmp_path, torchrun, make_plan):
    """Learned position embeddings at the rank's global positions, the causal mask by global positions,
    dK / dV reduce-scattered to their owners, the loss weighted 1/cp, parameters sharded and gradients
    reduce-scattered over the cp ranks (FSDP2 on the flattened dp × cp mesh)."""
    torchrun(tmp_path, cp2(make_plan, "tiny", sharding="zero3"), 2, "--steps", "2", *SGD)
    assert_matches_reference(tmp_path, "tiny", 2)


def test_cp2_llama_rope_gqa_with_selective_recompute_matches_single_process(tmp_path, torchrun, make_plan):
    """RoPE at global positions, grouped-query kv heads gathered before the repeat, the masked
    attention core re-run by selective recompute, gradients summed over cp by GradSumSync."""
    torchrun(tmp_path, cp2(make_plan, "tiny-llama", recompute="selective"), 2, "--steps", "2", *SGD)
    assert_matches_reference(tmp_path, "tiny-llama", 2)
