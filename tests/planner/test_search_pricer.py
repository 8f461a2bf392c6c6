"""The search's Pricer shares coefficients between stage contexts only where they are exactly equal.

`cost.stage.local_terms` (the part of a stage's coefficients its dp, sharding, rings and neighbours
leave alone) is computed once per local key and passed to `stage_coeffs`; it must give the very
coefficients `stage_coeffs` computes on its own.

`arrays.stage_key` maps a context's pp and dp link to canonical values (pp is read only on the last
stage and only as pp > 1; the dp link only when dp > 1). If a cost term starts reading either
elsewhere, the shared coefficients would be wrong for some stages: this test prices every context
of a grid both ways with `stage_coeffs` itself and demands equal coefficients, on a tied and an
untied model, with and without a calibration.
"""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from planner.cost.completion import ProfileNeed, complete_profiles
from planner.cost.devices import Link
from planner.cost.estimate import gpu_device
from planner.cost.memory import Stack
from planner.cost.stage import StageContext, local_terms, stage_coeffs
from planner.measure.calibrate import Calibration
from planner.search.arrays import Pricer, SegmentSpec, stage_key
from planner.search.classes import device_classes
from planner.specs.cluster import parse_cluster
from planner.specs.model import get_model

CLUSTER = parse_cluster(
    {
        "name": "two-kinds",
        "nodes": [
            {"name": "a", "device": "A100-SXM4-80GB", "num_devices": 8, "count": 2, "intra_link": "nvlink3",
             "inter_link": "ib-hdr"},
            {"name": "v", "device": "V100-SXM2-32GB", "num_devices": 8, "count": 2, "intra_link": "nvlink2",
             "inter_link": "ib-edr"},
        ],
    }
)  # fmt: skip
SLOW_RING = Link(3e9, 2e-5, num_nodes=2)
FP8_CLUSTER = parse_cluster(
    {
        "name": "with-fp8",
        "nodes": [
            {"name": "h", "device": "H100-SXM5-80GB", "num_devices": 8, "count": 2, "intra_link": "nvlink4",
             "inter_link": "ib-ndr"},
            {"name": "a", "device": "A100-SXM4-80GB", "num_devices": 8, "count": 2, "intra_link": "nvlink3",
             "inter_link": "ib-hdr"},
        ],
    }
)  # fmt: skip


@pytest.mark.parametrize("model_name, tied", [("gpt2-small", True), ("llama3-8b", False)])
@pytest.mark.parametrize("calibrated", [False, True])
def test_canonical_pp_and_dp_link_leave_the_coefficients_unchanged(model_name, tied, calibrated):
    # a tied embedding is what makes the last stage read pp (its own copy of the head's weights)
    model = get_model(model_name).model_copy(update={"tie_embeddings": tied})
    seq = 512
    needs = {ProfileNeed(b, seq, t, r, "bf16") for b in (1, 2) for t in (1, 2) for r in (False, True)}
    table = complete_profiles(model, CLUSTER, None, needs)
    calib = Calibration(num_ranks=4, compute_slowdown=1.5, grad_sync_overlap=0.3) if calibrated else None
    classes = device_classes(CLUSTER)
    checked = 0
    for c, tp, mbs, rec, (first, last), pp, sharding, dp, link in itertools.product(
        classes, (1, 2), (1, 2), (False, True), ((True, False), (False, False), (False, True), (True, True)),
        (1, 2, 3, 8), ("none", "zero2", "zero3"), (1, 2, 8), (c.inter for c in classes[:1]),
    ):  # fmt: skip
        if (first and last) != (pp == 1) or (dp == 1 and sharding != "none"):
            continue
        for dplink in (link, SLOW_RING):
            ctx = StageContext(
                kind=c.kind, dtype="bf16", mbs=mbs, seq=seq, tp=tp, recompute=rec, first=first, last=last, pp=pp,
                sharding=sharding, dp=dp, inflight=0.0, memory_bandwidth_bytes_per_s=c.spec.memory_bandwidth_bytes_per_s,
                tp_link=c.intra, dp_link=dplink, next_link=None, next_tp=tp, calib=calib,
            )  # fmt: skip
            pp_k, link_k = stage_key(c.intra, last, pp, dp, dplink)
            canon = StageContext(**{f: getattr(ctx, f) for f in StageContext._fields} | {"pp": pp_k, "dp_link": link_k})
            direct = stage_coeffs(ctx, model, table)
            assert stage_coeffs(canon, model, table) == direct, ctx
            # the local terms of a context that differs only in dp, sharding, rings, neighbours and
            # in-flight micro-batches, as the Pricer shares them
            other = StageContext(**{f: getattr(canon, f) for f in StageContext._fields} | {
                "dp": 1, "sharding": "none", "dp_link": c.intra, "inflight": 3.0, "next_link": SLOW_RING,
                "next_tp": 1, "memory_bandwidth_bytes_per_s": 1e12,
            })  # fmt: skip
            assert stage_coeffs(ctx, model, table, local_terms(other, model, table)) == direct, ctx
            checked += 1
    assert checked > 500


def test_pricer_returns_one_coefficient_object_for_contexts_that_share_a_key():
    """Stages that differ only in fields stage_coeffs ignores get the very same coefficients."""
    model = get_model("gpt2-small")
    seq = 512
    table = complete_profiles(model, CLUSTER, None, {ProfileNeed(1, seq, 1, False, "bf16")})
    pr = Pricer(model, device_classes(CLUSTER), table, "bf16", seq)
    inner = [pr.stage(0, 1, 1, False, False, False, pp, "none", 2, pr.dp_link(0, 2, 1)) for pp in (2, 5, 9)]
    assert inner[0] is inner[1] is inner[2]
    lasts = [pr.stage(0, 1, 1, False, False, True, pp, "none", 1, SLOW_RING) for pp in (2, 5)]
    assert lasts[0] is lasts[1]
    # dp > 1: the ring is priced, so a different ring is a different context
    assert pr.stage(0, 1, 1, False, False, False, 2, "none", 2, SLOW_RING) is not inner[0]


@pytest.mark.parametrize(
    "stack",
    [
        Stack(),
        Stack(sequence_parallel=True),
        Stack(sequence_parallel=True, fp8=True),
        Stack(attention="flash", dropout=True, selective=True),
        Stack(attention="eager", loss="fused"),
        Stack(sequence_parallel=True, cp=2),
    ],
    ids=["runtime", "sp", "sp-fp8", "flash-dropout-selective", "eager-fused-loss", "sp-cp2"],
)
def test_a_stage_without_recompute_is_priced_alike_under_every_recompute_every(stack):
    """Pricer.plain: a recompute-every-k pass takes its stages without recompute from the k = 1 pass.
    That is exact only while no cost term of such a stage reads recompute_every: price every
    context of a grid under k = 1, 2 and 3 (on a GPU device, so the stack's kernel deltas apply) and
    demand equal local terms and coefficients without recompute, and, as a check that the grid
    can see recompute_every at all, different ones with it."""
    model = get_model("llama3-8b")
    seq = 512
    needs = {ProfileNeed(b, seq, t, r, "bf16") for b in (1, 2) for t in (1, 2) for r in (False, True)}
    table = complete_profiles(model, FP8_CLUSTER, None, needs)
    # fp8 linears only where the device has an fp8 peak (as search.stack_variants offers them)
    classes = [c for c in device_classes(FP8_CLUSTER) if c.spec.peak_fp8_flop_per_s or not stack.fp8]
    differs = 0
    for c, tp, mbs, rec, (first, last), sharding, dp in itertools.product(
        classes, (1, 2), (1, 2), (False, True), ((True, False), (False, False), (False, True)),
        ("none", "zero3"), (1, 8),
    ):  # fmt: skip
        if dp == 1 and sharding != "none":
            continue
        out = []
        for k in (1, 2, 3):
            ctx = StageContext(
                kind=c.kind, dtype="bf16", mbs=mbs, seq=seq, tp=tp, recompute=rec, first=first, last=last, pp=4,
                sharding=sharding, dp=dp, inflight=2.0, memory_bandwidth_bytes_per_s=c.spec.memory_bandwidth_bytes_per_s,
                tp_link=c.intra, dp_link=c.inter, next_link=c.inter, next_tp=tp, calib=None,
                stack=replace(stack, recompute_every=k), device=gpu_device(c.spec, "bf16", None),
                cp_link=c.intra if stack.cp > 1 else None,
            )  # fmt: skip
            out.append((local_terms(ctx, model, table), stage_coeffs(ctx, model, table)))
        if rec:
            differs += out[0] != out[1]
        else:
            assert out[0] == out[1] == out[2], (c.kind, tp, mbs, first, last, sharding, dp)
    assert differs > 0


def test_a_pricer_with_a_plain_pass_prices_as_one_without():
    """Pricer(stack k = 2, plain = the k = 1 pass's) gives coefficients equal to a Pricer of its own,
    with recompute and without, and without recompute the very objects of the plain pass."""
    model = get_model("llama3-8b")
    seq = 512
    needs = {ProfileNeed(b, seq, t, r, "bf16") for b in (1,) for t in (1, 2) for r in (False, True)}
    table = complete_profiles(model, CLUSTER, None, needs)
    classes = device_classes(CLUSTER)
    one = Pricer(model, classes, table, "bf16", seq, stack=Stack(sequence_parallel=True))
    two = Pricer(model, classes, table, "bf16", seq, stack=Stack(sequence_parallel=True, recompute_every=2), plain=one)
    alone = Pricer(model, classes, table, "bf16", seq, stack=Stack(sequence_parallel=True, recompute_every=2))
    for cls, tp, rec, first, last, dp in itertools.product((0, 1), (1, 2), (False, True), (False, True),
                                                          (False, True), (1, 4)):  # fmt: skip
        args = (cls, tp, 1, rec, first, last, 3)
        assert two.local(*args) == alone.local(*args)
        co = two.stage(*args, "none", dp, two.dp_link(cls, 4 * tp, tp))
        assert co == alone.stage(*args, "none", dp, alone.dp_link(cls, 4 * tp, tp))
        if not rec:
            assert co is one.stage(*args, "none", dp, one.dp_link(cls, 4 * tp, tp))
    seg = SegmentSpec(0, 2, 3, 8, two.dp_link(0, 8, 2))
    for rec in (False, True):
        got = two.segment_rows(seg, 1, rec, "zero2", 4, True, False, 5)
        want = alone.segment_rows(SegmentSpec(0, 2, 3, 8, alone.dp_link(0, 8, 2)), 1, rec, "zero2", 4, True, False, 5)
        assert np.array_equal(got.rows, want.rows) and got.coeffs == want.coeffs
    with pytest.raises(AssertionError):
        Pricer(model, classes, table, "bf16", seq, stack=Stack(recompute_every=2), plain=one)  # another stack
