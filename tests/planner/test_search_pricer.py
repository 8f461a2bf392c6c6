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

import pytest

from planner.cost.completion import ProfileNeed, complete_profiles
from planner.cost.devices import Link
from planner.cost.stage import StageContext, local_terms, stage_coeffs
from planner.measure.calibrate import Calibration
from planner.search.arrays import Pricer, stage_key
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


@pytest.mark.parametrize("model_name, tied", [("gpt2-small", True), ("llama3-8b", False)])
@pytest.mark.parametrize("calibrated", [False, True])
def test_canonical_pp_and_dp_link_leave_the_coefficients_unchanged(model_name, tied, calibrated):
    # a tied embedding is what makes the last stage read pp (its own copy of the head's weights)
    model = get_model(model_name).model_copy(update={"tie_embeddings": tied})
    seq = 512
    needs = {ProfileNeed(b, seq, t, r, "bf16") for b in (1, 2) for t in (1, 2) for r in (False, True)}
    table = complete_profiles(model, CLUSTER, None, needs)
    calib = Calibration(num_ranks=4, compute_slowdown=1.5, grad_sync_overlap=0.3) if calibrated else None
    classes = device_classes(CLUSTER, "bf16")
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
    pr = Pricer(model, device_classes(CLUSTER, "bf16"), table, "bf16", seq)
    inner = [pr.stage(0, 1, 1, False, False, False, pp, "none", 2, pr.dp_link(0, 2, 1)) for pp in (2, 5, 9)]
    assert inner[0] is inner[1] is inner[2]
    lasts = [pr.stage(0, 1, 1, False, False, True, pp, "none", 1, SLOW_RING) for pp in (2, 5)]
    assert lasts[0] is lasts[1]
    # dp > 1: the ring is priced, so a different ring is a different context
    assert pr.stage(0, 1, 1, False, False, False, 2, "none", 2, SLOW_RING) is not inner[0]
