"""planner.cost.overlap: each runtime's overlap rule pinned to hand-computed exposed times."""

import pytest

from planner.cost import estimate
from planner.cost import overlap as OV
from planner.errors import MeshplanError
from planner.specs.cluster import parse_cluster
from planner.specs.model import get_model
from planner.specs.plan import Plan, StagePlan

MS = 1e-3
# one block: 1 MB of weights (or gradients), 2 ms forward, 4 ms backward; no embedding / head rows
BLOCK = (1e6, 2 * MS, 4 * MS)


def tail_s(t: OV.DpTerms, n: int) -> float:
    """After the pipeline, as StageCoeffs.tail_s adds it up (less the optimizer)."""
    return max(0.0, t.e0 + t.e1 * n) + t.g0 + t.g1 * n


def per_microbatch_s(t: OV.DpTerms, n: int) -> float:
    return t.zero3_a * n + t.zero3_b


def test_meshplan_all_reduces_after_the_schedule_so_nothing_hides_it():
    ar = OV.Collective(1 * MS, 1e-9)  # 1 ms latency, 1 GB/s effective
    t = OV.dp_terms(OV.MESHPLAN, "none", ar, ar, ar, BLOCK, [(5e5, 1 * MS, 2 * MS)])
    # 1 ms + (4 × 1 MB + 0.5 MB) / 1 GB/s = 5.5 ms, all of it after the last backward
    assert tail_s(t, 4) == pytest.approx(5.5 * MS)
    assert per_microbatch_s(t, 4) == 0.0


def test_megatron_buckets_hide_behind_the_last_backward_except_the_last_bucket():
    fast, slow = OV.Collective(1 * MS, 1e-9), OV.Collective(1 * MS, 1e-8)
    consts = [(5e5, 1 * MS, 2 * MS)]
    # last bucket 0.8 MB: 1 ms + 0.8 ms = 1.8 ms launched after the backward
    t = OV.dp_terms(OV.MEGATRON, "none", fast, fast, fast, BLOCK, consts, bucket_bytes=8e5)
    # n = 4: sync 5.5 ms under a 4 × 4 + 2 = 18 ms backward: only the last bucket shows
    assert tail_s(t, 4) == pytest.approx(1.8 * MS)
    t = OV.dp_terms(OV.MEGATRON, "none", slow, slow, slow, BLOCK, consts, bucket_bytes=8e5)
    # 10× slower link: sync 1 + 45 = 46 ms, 18 ms of it hidden: max(9 ms last bucket, 28 ms) = 28 ms
    assert tail_s(t, 4) == pytest.approx(28 * MS)


def test_sc21_megatron_syncs_after_the_schedule():
    ar = OV.Collective(1 * MS, 1e-9)
    t = OV.dp_terms(OV.MEGATRON_SC21, "none", ar, ar, ar, BLOCK, [])
    assert tail_s(t, 8) == pytest.approx(1 * MS + 8 * MS)


def test_meshplan_reduce_scatters_after_the_schedule_and_prefetches_its_gathers():
    c = OV.Collective(0.1 * MS, 2e-9)  # one block's all-gather or reduce-scatter: 0.1 + 2 = 2.1 ms
    t = OV.dp_terms(OV.MESHPLAN, "zero3", c, c, c, BLOCK, [])
    # per micro-batch: forward hides 2 of 2.1 ms (0.1 exposed), backward hides all of it
    assert per_microbatch_s(t, 8) == pytest.approx(8 * 0.1 * MS)
    # torch's schedules reduce-scatter after the last micro-batch: 0.1 + 8 × 2 ms, all exposed
    assert tail_s(t, 8) == pytest.approx(16.1 * MS)
    slow = OV.Collective(0.1 * MS, 1e-8)  # 10.1 ms per gather against 2 ms / 4 ms of compute
    t = OV.dp_terms(OV.MESHPLAN, "zero3", slow, slow, slow, BLOCK, [])
    assert per_microbatch_s(t, 2) == pytest.approx(2 * ((10.1 - 2) + (10.1 - 4)) * MS)


def test_a_last_backward_hides_the_reduce_scatter_behind_what_its_all_gathers_leave():
    c = OV.Collective(0.1 * MS, 2e-9)
    # a runtime reduce-scattering in the last backward (Megatron's rule applied to zero3)
    t = OV.dp_terms(OV.MEGATRON, "zero3", c, c, c, BLOCK, [])
    # 4 ms per block less its 2.1 ms gather leaves 1.9 ms for a 2 ms reduce-scatter; 8 blocks:
    # 0.1 + 16 − 8 × 1.9 = 0.9 ms, but the first block's 2.1 ms comes after all compute
    assert tail_s(t, 8) == pytest.approx(2.1 * MS)
    slow = OV.Collective(0.1 * MS, 1e-8)  # 10.1 ms per gather: nothing left to hide the reduce-scatter
    t = OV.dp_terms(OV.MEGATRON, "zero3", slow, slow, slow, BLOCK, [])
    assert tail_s(t, 2) == pytest.approx((0.1 + 2 * 10) * MS)
    # the distributed optimizer (zero1): no gathers in backward, the whole 4 ms hides the 2 ms
    # reduce-scatter; the first block's 2.1 ms shows, and the next forward hides the 2 ms gathers
    t = OV.dp_terms(OV.MEGATRON, "zero1", c, c, c, BLOCK, [])
    assert tail_s(t, 8) == pytest.approx((2.1 + 0.1) * MS) and per_microbatch_s(t, 8) == 0.0


def test_composer_fsdp_reduce_scatters_in_every_micro_batch_on_the_gathers_communicator():
    c = OV.Collective(0.1 * MS, 2e-9)
    t = OV.dp_terms(OV.FSDP_COMPOSER, "zero3", c, c, c, BLOCK, [])
    # per micro-batch, 8 blocks: forward 8 × 0.1 ms; backward AG + RS = 4.2 ms against 4 ms on 7 blocks
    # (0.2 ms each) and the first block's 2.1 ms reduce-scatter after all compute
    assert per_microbatch_s(t, 8) == pytest.approx((0.8 + 7 * 0.2 + 2.1) * MS)
    assert tail_s(t, 8) == 0.0


def test_zero2_gathers_updated_shards_in_the_next_forward():
    c = OV.Collective(0.1 * MS, 3e-9)  # 3 ms of bandwidth per block against a 2 ms forward
    t = OV.dp_terms(OV.MESHPLAN, "zero2", c, c, c, BLOCK, [])
    assert t.g1 == pytest.approx(1 * MS) and per_microbatch_s(t, 4) == 0.0
    # Composer reshards after every synced backward: the gather repeats per micro-batch
    t = OV.dp_terms(OV.FSDP_COMPOSER, "zero2", c, c, c, BLOCK, [])
    # its reduce-scatter (3.1 ms) hides behind the 4 ms backward
    assert t.g1 == 0.0 and t.zero3_a == pytest.approx(1 * MS)


def test_measured_overlap_replaces_every_fraction():
    c = OV.Collective(0.1 * MS, 2e-9)
    for rt in OV.RUNTIMES.values():
        t = OV.dp_terms(rt, "zero3", c, c, c, BLOCK, [], fsdp_s=(0.5 * MS, 0.0), measured_overlap=0.0)
        # in line: two 2.1 ms gathers + FSDP2's 2 × 0.5 ms per block and micro-batch; the whole
        # reduce-scatter, 0.1 + n × 2 ms, plus its 0.5 ms per block, after the pipeline
        assert per_microbatch_s(t, 3) == pytest.approx(3 * (4.2 + 1.0) * MS)
        assert tail_s(t, 3) == pytest.approx((0.1 + 6 + 1.5) * MS)


def test_cpu_ranks_and_schedules_change_what_overlaps():
    cpu = OV.MESHPLAN.on_cpu()
    assert (cpu.reduce_scatter_overlap, cpu.gather_overlap, cpu.param_gather_overlap) == (0.0, 0.0, 0.0)
    assert OV.MEGATRON.for_schedule("1f1b").p2p_overlap == 0.0
    assert OV.MEGATRON.for_schedule("interleaved-1f1b").p2p_overlap == 1.0
    assert OV.megatron_bucket_params(8) == 40e6 and OV.megatron_bucket_params(64) == 64e6
    with pytest.raises(MeshplanError, match="runtime"):
        OV.runtime_named("deepspeed")


def _dp_plan(sharding: str, num_microbatches: int = 2) -> tuple[Plan, object]:
    cluster = parse_cluster(
        {
            "name": "2xa100",
            "nodes": [
                {
                    "name": "n",
                    "device": "A100-SXM4-80GB",
                    "num_devices": 1,
                    "count": 2,
                    "intra_link": "nvlink3",
                    "inter_link": "eth-100g",
                }
            ],
        }
    )
    mbs = 4
    plan = Plan(
        model="gpt2-small",
        cluster="2xa100",
        global_batch_size=2 * mbs * num_microbatches,
        seq_len=1024,
        micro_batch_size=mbs,
        dtype="bf16",
        batch_shares=(mbs * num_microbatches,) * 2,
        stages=(StagePlan(layer_start=0, layer_end=12, device_ids=(0, 1), tp=1, dp=2, sharding=sharding),),
    )
    return plan, cluster


def test_estimate_prices_the_chosen_runtime():
    model = get_model("gpt2-small")
    plan, cluster = _dp_plan("none")
    own = estimate(plan, model, cluster)
    sc21 = estimate(plan, model, cluster, runtime=OV.MEGATRON_SC21)
    mega = estimate(plan, model, cluster, runtime=OV.MEGATRON)
    # meshplan and SC'21 Megatron both sync after the schedule; meshplan also packs small gradients
    assert own.dp_comm_s >= sc21.dp_comm_s > mega.dp_comm_s > 0
    assert any(n.startswith("runtime: megatron") for n in mega.notes)
    assert not any(n.startswith("runtime:") for n in own.notes)


def test_composer_pays_the_last_reduce_scatter_every_micro_batch_meshplan_once():
    model = get_model("gpt2-small")
    plan, cluster = _dp_plan("zero3", num_microbatches=4)
    own = estimate(plan, model, cluster)
    composer = estimate(plan, model, cluster, runtime=OV.FSDP_COMPOSER)
    assert composer.dp_comm_s > own.dp_comm_s > 0
    assert composer.compute_s == pytest.approx(own.compute_s)
