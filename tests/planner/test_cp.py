"""Context parallelism (StagePlan.cp): validators, the K/V exchange pinned to hand counts, estimate's
per-rank compute and memory, the exports and the launch contract.

tiny: h = 64, a = 4 heads (kv = 4), d = 16, ffn = 256, 4 blocks; bf16 (e = 2).
"""

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from planner.cost import estimate
from planner.cost import formulas as F
from planner.cost import memory as M
from planner.cost.completion import complete_profiles
from planner.cost.compute import cp_shape_delta_s
from planner.cost.devices import DeviceIndex
from planner.cost.estimate import _place, _stage_context, gpu_device, plan_profile_needs
from planner.cost.overlap import MESHPLAN
from planner.cost.stage import stage_coeffs
from planner.report.export import to_megatron, to_torchtitan
from planner.runtime import launch_problems, rank_map
from planner.specs.cluster import parse_cluster
from planner.specs.model import get_model
from planner.specs.plan import Plan, StagePlan, parse_plan_json

TINY = get_model("tiny")
LLAMA = get_model("llama3-70b")


def gpus(n: int, device: str = "H100-SXM5-80GB", nodes: int = 1):
    node = {"name": "n", "device": device, "num_devices": n, "count": nodes}
    return parse_cluster({"name": "c", "nodes": [dict(node, intra_link="nvlink4", inter_link="ib-ndr")]})


def cp_plan(cp: int, *, model=TINY, seq=64, mbs=2, tp=1, dp=1, pp=1, recompute="none", gb=None):
    n, w = model.num_layers // pp, dp * cp * tp
    stages = tuple(
        StagePlan(
            layer_start=i * n,
            layer_end=(i + 1) * n,
            device_ids=tuple(range(i * w, (i + 1) * w)),
            tp=tp,
            dp=dp,
            cp=cp,
            recompute=recompute,
        )
        for i in range(pp)
    )
    gb = gb or mbs * dp
    return Plan(
        model=model.name,
        cluster="c",
        global_batch_size=gb,
        seq_len=seq,
        micro_batch_size=mbs,
        stages=stages,
        batch_shares=(gb // dp,) * dp,
    )


def test_a_stage_needs_dp_cp_tp_devices_and_2cp_dividing_seq_and_one_cp_for_all_stages():
    with pytest.raises(ValueError, match=r"dp×cp×tp = 1×2×2 = 4 devices"):
        StagePlan(layer_start=0, layer_end=4, device_ids=(0, 1), tp=2, cp=2)
    with pytest.raises(ValueError, match=r"2·cp = 8 equal"):
        cp_plan(4, seq=36)
    with pytest.raises(ValueError, match="same cp"):
        a = StagePlan(layer_start=0, layer_end=2, device_ids=(0, 1), cp=2)
        b = StagePlan(layer_start=2, layer_end=4, device_ids=(2,))
        Plan(model="tiny", cluster="c", global_batch_size=2, seq_len=64, micro_batch_size=2, stages=(a, b),
             batch_shares=(2,))  # fmt: skip


def test_old_plans_load_with_cp_1_and_keep_their_id():
    text = (Path(__file__).parents[1] / "data" / "plan_v1.json").read_text()
    plan = parse_plan_json(text)
    assert plan.cp == 1 and all(s.cp == 1 for s in plan.stages)
    data = json.loads(text)
    for st in data["stages"]:
        st["cp"] = 1
    assert parse_plan_json(json.dumps(data)).fingerprint() == plan.fingerprint()


def test_kv_exchange_is_an_all_gather_forward_and_a_reduce_scatter_backward_of_the_gathered_kv():
    # K and V of the whole sequence on one tp rank: 2·b·s·g·d·e = 2·2·64·4·16·2 = 32768 bytes
    assert M.cp_gathered_kv_bytes(TINY, 2, 64, 1, "bf16") == 32768
    # tp 2 holds 2 of the 4 kv heads: half
    assert M.cp_gathered_kv_bytes(TINY, 2, 64, 2, "bf16") == 16384
    # cp 2 at 1 GB/s, α 10 µs: t_ag = (1/2)·32768/1e9 + 1·1e-5 = 2.6384e-5 s; fwd + bwd = 2·t_ag
    assert F.cp_kv_exchange_s(32768, 2, 1e9, 1e-5) == pytest.approx(5.2768e-5)
    # cp 4: t_ag = (3/4)·32768/1e9 + 3e-5 = 5.4576e-5; every block recomputed adds one more gather
    assert F.cp_kv_exchange_s(32768, 4, 1e9, 1e-5, recomputed=1.0) == pytest.approx(3 * 5.4576e-5)
    assert F.cp_kv_exchange_s(32768, 1, 1e9, 1e-5) == 0.0


def test_cp_halves_a_ranks_compute_and_adds_the_kv_exchange_per_block():
    one, two = estimate(cp_plan(1), TINY, gpus(1)), estimate(cp_plan(2), TINY, gpus(2))
    # the load-balanced chunks give each rank half the tokens and half the causal attention work, and
    # its linears run GEMMs on 32 tokens, further from the roof than 1/2 of the 64-token ones: that
    # extra, per block (4 blocks, one micro-batch), is what the GPU pays beyond exactly half
    dev = gpu_device(gpus(2).nodes[0], "bf16", None)
    dfwd, dbwd = cp_shape_delta_s(TINY, 2, 64, 1, "bf16", dev, 2)
    assert dfwd > 0 and dbwd > 0
    assert two.compute_s == pytest.approx(one.compute_s / 2 + 4 * (dfwd + dbwd))
    assert cp_shape_delta_s(TINY, 2, 64, 1, "bf16", dev, 1) == (0.0, 0.0)
    link = DeviceIndex(gpus(2)).ring_link([0, 1])
    t = F.cp_kv_exchange_s(32768, 2, link.bandwidth_bytes_per_s, link.latency_s)
    assert two.cp_comm_s == pytest.approx(4 * t)  # 4 blocks, one micro-batch
    assert one.cp_comm_s == 0.0
    # gradients now sum over the 2 cp ranks: an exposed all-reduce that the single rank did not pay
    assert two.dp_comm_s > one.dp_comm_s == 0.0


def test_cp_keeps_a_ranks_share_of_activations_plus_the_other_ranks_kv():
    def coeffs(p, cluster):
        idx = DeviceIndex(cluster)
        table = complete_profiles(TINY, cluster, None, plan_profile_needs(p), kinds={"H100-SXM5-80GB"})
        place = _place(p, idx, 0, 0)
        ctx = _stage_context(p, idx, 0, 0, place, cluster.nodes[0], None, None, MESHPLAN)
        return stage_coeffs(ctx, TINY, table)

    a, b = coeffs(cp_plan(1), gpus(1)), coeffs(cp_plan(2), gpus(2))
    # SDPA reads K, V repeated to the 4 query heads: the other rank's half of 2·2·64·4·16·2 bytes
    assert b.activation_bytes_per_block == pytest.approx(a.activation_bytes_per_block / 2 + 32768 / 2)
    assert b.activation_bytes_fixed == pytest.approx(a.activation_bytes_fixed / 2)
    assert b.state_bytes_per_block == a.state_bytes_per_block  # parameters are replicated over cp


def test_llama3_70b_at_32k_on_the_same_64_gpus_cp4_keeps_less_and_steps_faster_than_pp8():
    # 64 H100s, tp 8, no recompute: pp 8 × cp 1 keeps 80/8 blocks of 32k tokens (390 GiB), pp 2 × cp 4
    # keeps 40 blocks of 8k tokens plus the gathered K, V (174 GiB); fewer stages, a smaller bubble
    kw = dict(model=LLAMA, seq=32768, mbs=1, tp=8, gb=16)
    no_cp = estimate(cp_plan(1, pp=8, **kw), LLAMA, gpus(8, nodes=8))
    cp4 = estimate(cp_plan(4, pp=2, **kw), LLAMA, gpus(8, nodes=8))
    assert max(cp4.peak_memory_bytes) < max(no_cp.peak_memory_bytes)
    assert cp4.step_time_s < no_cp.step_time_s


def test_exports_name_the_cp_degree_and_the_all_gather_exchange():
    p = cp_plan(2, tp=2, seq=64)
    tt = tomllib.loads(to_torchtitan(p)[0])
    assert tt["parallelism"]["context_parallel_degree"] == 2
    assert tt["parallelism"]["context_parallel_rotate_method"] == "allgather"
    meg = to_megatron(p, TINY)[0]
    assert "--context-parallel-size 2" in meg and "--cp-comm-type all_gather" in meg
    assert "--context-parallel-size" not in to_megatron(cp_plan(1), TINY)[0]


def test_rank_map_puts_cp_between_replica_and_tp():
    p = cp_plan(2, tp=2, dp=2, gb=4)
    slots = rank_map(p)
    assert [(s.replica, s.cp_index, s.tp_index) for s in slots[:4]] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert slots[4].replica == 1 and slots[4].cp_index == 0


def test_runtime_refuses_cp_only_where_it_cannot_run_it():
    assert launch_problems(cp_plan(2), 2, TINY) == ()
    assert launch_problems(cp_plan(2, pp=2, mbs=1, gb=2), 4, TINY) == ()
    uneven = Plan(
        model="tiny", cluster="c", global_batch_size=2, seq_len=64, micro_batch_size=2, batch_shares=(2,),
        stages=(StagePlan(layer_start=0, layer_end=2, device_ids=(0, 1, 2, 3), tp=2, cp=2),
                StagePlan(layer_start=2, layer_end=4, device_ids=(4, 5), tp=1, cp=2)),
    )  # fmt: skip
    assert [q.field for q in launch_problems(uneven, 6, TINY)] == ["stages.cp"]
    # sequence parallelism splits a cp rank's seq / cp tokens over tp
    sp = cp_plan(2, tp=2, seq=64)
    sp = sp.model_copy(update={"stages": (sp.stages[0].model_copy(update={"sequence_parallel": True}),)})
    assert launch_problems(sp, 4, TINY) == ()
    odd = cp_plan(2, tp=4, seq=36)
    odd = odd.model_copy(update={"stages": (odd.stages[0].model_copy(update={"sequence_parallel": True}),)})
    assert [str(q) for q in launch_problems(odd, 8, TINY)] == [
        "stages[0].sequence_parallel=True: sequence parallelism splits seq_len / cp = 18 over tp=4; make tp divide it"
    ]


def test_a_runtime_hiding_part_of_the_exchange_books_only_the_rest():
    hiding = replace(MESHPLAN, name="half", cp_overlap=0.5)
    base, half = (estimate(cp_plan(2), TINY, gpus(2), runtime=rt) for rt in (MESHPLAN, hiding))
    assert half.cp_comm_s == pytest.approx(base.cp_comm_s / 2)
    assert half.tp_comm_s == base.tp_comm_s  # the TP all-reduces keep their own (zero) overlap
    assert hiding.on_cpu().cp_overlap == 0.0  # no side streams on CPU ranks
