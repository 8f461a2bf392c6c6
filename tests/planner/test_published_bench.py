"""bench/published.py maps a published row to the plan that ran: degrees, order, batch, measured step."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("published_bench", ROOT / "bench/published.py")
bench = importlib.util.module_from_spec(spec)
sys.modules["published_bench"] = bench  # dataclasses resolve their module by name
spec.loader.exec_module(bench)

SC21 = {
    "run_id": "sc21_t1_76.1B",
    "source": "Narayanan et al., SC'21",
    "model_name": "GPT 76.1B",
    "layers": "60",
    "hidden": "10240",
    "heads": "80",
    "ffn_hidden": "40960",
    "seq_len": "2048",
    "vocab": "51200",
    "global_batch": "1792",
    "micro_batch": "2",
    "tp": "8",
    "pp": "4",
    "dp": "32",
    "cp": "",
    "vpp": "3",
    "gpu": "A100-SXM4-80GB",
    "num_gpus": "1024",
    "gpus_per_node": "8",
    "interconnect": "Selene",
    "recompute": "full (activation recomputation)",
    "sharding": "",
    "precision": "fp16 mixed",
    "tokens_per_sec": "",
    "derived_iteration_time_s": "16.058",
    "heterogeneous": "no",
}


def test_megatron_row_becomes_interleaved_3d_plan_in_megatron_rank_order():
    case = bench.build_case(SC21)
    p = case.plan
    assert (p.pp, p.dp, p.virtual_stages, p.schedule) == (4, 32, 3, "interleaved-1f1b")
    assert len(p.stages) == 12 and all(s.num_layers == 5 for s in p.stages)
    # tp fastest, then dp, then pp: stage 1 (pipeline rank 1) starts after 32 × 8 devices
    assert p.stages[1].device_ids[:9] == tuple(range(256, 265))
    assert p.stages[4].device_ids == p.stages[0].device_ids  # virtual stage 4 lives on rank 0
    assert p.num_microbatches() == 1792 // 32 // 2
    assert p.dtype == "fp16" and p.stages[0].recompute == "full" and p.stages[0].sharding == "none"
    assert case.model.has_learned_positions and case.measured_s == pytest.approx(16.058)
    assert case.cluster.num_devices == 1024


def test_mpt_row_measures_batch_tokens_over_throughput_and_fp8_rows_run_fp8_linears():
    row = dict(SC21, source="MosaicML llm-foundry", tp="1", pp="1", dp="8", vpp="", num_gpus="8")
    row.update(sharding="FSDP FULL_SHARD", precision="amp_bf16", interconnect="1600 Gbps node-node (RoCE)")
    row.update(global_batch="32", micro_batch="2", tokens_per_sec="4096", recompute="none", layers="4")
    case = bench.build_case(row)
    assert case.measured_s == pytest.approx(32 * 2048 / 4096)
    assert case.plan.num_microbatches() == 2 and case.plan.stages[0].sharding == "zero3"
    assert not case.model.has_learned_positions  # ALiBi
    fp8 = bench.build_case(dict(row, precision="amp_fp8", gpu="H100-SXM5-80GB", interconnect=""))
    assert fp8.plan.fp8 and fp8.plan.dtype == "bf16" and fp8.family == "mpt"  # Composer's stack, fp8 linears


def test_each_framework_maps_to_the_stack_it_ran_and_megatron_rows_fit():
    meg = bench.build_case(SC21)
    assert (meg.plan.attention, meg.plan.loss, meg.plan.dropout) == ("eager", "vocab-parallel", True)
    cost = bench.price([meg])[0][0].cost
    assert cost.feasible  # full recompute keeps one block's s×s probabilities at a time
    row = dict(SC21, source="MosaicML llm-foundry", tp="1", pp="1", dp="8", vpp="", num_gpus="8")
    row.update(sharding="FSDP FULL_SHARD", precision="amp_bf16", interconnect="1600 Gbps node-node (RoCE)")
    row.update(global_batch="32", micro_batch="2", tokens_per_sec="4096", recompute="none", layers="4")
    mpt = bench.build_case(row)
    assert (mpt.plan.attention, mpt.plan.loss, mpt.plan.dropout) == ("flash", "fused", False)
    assert bench.runtime_stack(mpt).plan.loss == "torch"


def test_each_row_is_priced_under_its_frameworks_overlap():
    assert bench.build_case(SC21).profile.overlap.name == "megatron-sc21"
    row = dict(SC21, source="MosaicML llm-foundry", tp="1", pp="1", dp="8", vpp="", num_gpus="8")
    row.update(sharding="FSDP FULL_SHARD", precision="amp_bf16", interconnect="1600 Gbps node-node (RoCE)")
    row.update(global_batch="32", micro_batch="2", tokens_per_sec="4096", recompute="none", layers="4")
    row["framework"] = "Composer + llm-foundry (FSDP)"
    mpt = bench.build_case(row)
    assert mpt.profile.name == "composer" and mpt.profile.overlap.name == "fsdp-composer"
    assert bench.with_runtime(mpt, "meshplan").profile.name == "meshplan"
    assert bench.with_runtime(mpt, "row") is mpt


AMP = dict(
    SC21,
    run_id="amp_homogeneous_1",
    source="Li et al., 'AMP' NeurIPS'22",
    layers="24",
    hidden="1024",
    heads="",
    ffn_hidden="",
    vocab="52256",
    seq_len="1024",
    global_batch="32",
    micro_batch="2",
    tp="1",
    pp="1",
    dp="16",
    vpp="",
    cp="1",
    gpu="T4",
    num_gpus="16",
    gpus_per_node="4",
    recompute="",
    precision="fp16 (DeepSpeed default)",
    derived_iteration_time_s="",
    iteration_time_s="",
    measurement_kind="failed real trial",
)


def test_new_families_map_their_stack_and_a_failed_trial_has_no_measured_time():
    amp = bench.build_case(AMP)
    assert amp.family == "amp-deepspeed" and amp.measured_s is None and amp.profile.name == "deepspeed-amp"
    assert amp.model.num_heads == 16 and amp.model.ffn == 4096 and amp.plan.dtype == "fp16"
    # line rate per GPU at NCCL TCP sockets' achieved fraction (no EFA / GPUDirect RDMA on g4dn)
    assert amp.cluster.nodes[0].inter_link.bandwidth_bytes_per_s == pytest.approx(50e9 / 8 / 4 * 4.7 / 12.5)
    # inside a node: the 50 Gb/s AMP's paper states for g4dn.12xlarge's PCIe, as achieved (no NCCL link factor)
    assert amp.cluster.nodes[0].intra_link.bandwidth_bytes_per_s == 50e9 / 8
    ran = bench.build_case(dict(AMP, measurement_kind="measured real trial", iteration_time_s="1.32"))
    assert ran.measured_s == 1.32
    tt = dict(SC21, source="pytorch/torchtitan docs", gpu="H100-HBM2e-96GB-500W (Meta Grand Teton)", kv_heads="8")
    tt.update(tp="8", pp="1", dp="16", vpp="", num_gpus="128", global_batch="32", micro_batch="2")
    tt.update(recompute="selective layer", sharding="FSDP2", precision="bf16", tokens_per_sec="13952", seq_len="8192")
    case = bench.build_case(tt)
    s0 = case.plan.stages[0]
    assert case.family == "torchtitan" and case.gpu == "H100-HBM2e-96GB-500W"
    assert (s0.recompute, s0.recompute_every, s0.sharding, s0.sequence_parallel) == ("full", 2, "zero3", True)
    assert case.model.family == "llama" and case.measured_s == pytest.approx(32 * 8192 / 13952)


def test_amp_gradients_cross_the_network_as_fp32():
    """AMP's ds_config.json sets fp32_allreduce: the whole gradient (356,968,448 parameters: 24 blocks of
    12·1024² + 13·1024, the 52352 × 1024 padded embedding, 1024 × 1024 positions, the final norm) is
    all-reduced as 4-byte elements over a 16-rank ring on 4 nodes, each node's NIC at NCCL sockets'
    2.35 GB/s (50 Gb/s × 4.7 / 12.5): 2·15/16 · 356,968,448 · 4 B / 2.35e9 B/s = 1.1393 s (+ latency)."""
    from planner.cost.runtimes import PRIOR_FIGURES, price_under, profile_named
    from planner.cost.stage import grad_wire_bytes

    case = bench.build_case(dict(AMP, micro_batch="1", measurement_kind="measured real trial", iteration_time_s="1.32"))
    rt = case.profile.overlap
    assert (grad_wire_bytes("fp16", "none", rt), grad_wire_bytes("fp16", "zero1", rt)) == (4, 2)
    assert grad_wire_bytes("fp16", "none", profile_named("deepspeed").overlap) == 2
    fp32 = price_under(case.plan, case.model, case.cluster, case.profile, PRIOR_FIGURES, restack=False)
    fp16 = price_under(case.plan, case.model, case.cluster, profile_named("deepspeed"), PRIOR_FIGURES, restack=False)
    wire = 2 * 15 / 16 * 356_968_448 * 4 / (50e9 / 8 * 4.7 / 12.5)
    assert wire == pytest.approx(1.1393, abs=1e-4)
    assert fp32.dp_comm_s == pytest.approx(wire, rel=1e-3)  # the ring's latency is < 0.1 %
    assert fp16.dp_comm_s == pytest.approx(wire / 2, rel=2e-3)
    assert fp32.step_time_s - fp16.step_time_s == pytest.approx(fp32.dp_comm_s - fp16.dp_comm_s, rel=1e-9)


def test_deepspeed_pipeline_sends_the_fp16_mask_forward_and_the_whole_gradient_back():
    """DeepSpeed's PipelineEngine under GPT2ModelPipe: with tp = 4 each rank sends 1/4 of the 1 × 1024 × 1024
    fp16 activation (524,288 B) plus the [1, 1, 1024, 1024] mask as fp16 (2,097,152 B), and receives the
    gradient whole (2,097,152 B); Megatron's scatter/gather sends 524,288 B each way."""
    from planner.cost.devices import Link
    from planner.cost.overlap import MESHPLAN, RUNTIMES
    from planner.cost.stage import boundary_p2p_s, p2p_boundary_bytes

    amp = RUNTIMES["deepspeed-amp"]
    hidden = 1 * 1024 * 1024 * 2
    assert p2p_boundary_bytes(hidden, 4, 4, 1024, amp) == (524_288 + 2_097_152, 2_097_152)
    assert p2p_boundary_bytes(hidden, 4, 4, 1024, MESHPLAN) == (524_288, 524_288)
    assert p2p_boundary_bytes(hidden, 1, 1, 1024, amp) == (2 * 2_097_152, 2_097_152)
    # one GPU's share of g4dn's NIC at NCCL sockets' rate, 50 µs a message: 2 messages
    link = Link(50e9 / 8 / 4 * 4.7 / 12.5, 50e-6)
    assert link.bandwidth_bytes_per_s == pytest.approx(587.5e6)
    got = boundary_p2p_s(hidden, 4, 4, link, None, amp, 1024)
    assert got == pytest.approx(2 * 50e-6 + (2_621_440 + 2_097_152) / 587.5e6)  # 8.132 ms
    assert got == pytest.approx(8.1317e-3, rel=1e-4)
    assert boundary_p2p_s(hidden, 4, 4, link, None) == pytest.approx(2 * 50e-6 + 2 * 524_288 / 587.5e6)


def test_pipelined_amp_rows_all_reduce_the_tied_embedding_between_first_and_last_stage():
    """pp = 4, dp = 4 on 4 nodes of 4 T4: stage 0 (node 0) and stage 3 (node 3) each hold the 52352 × 1024
    word embedding; DeepSpeed all-reduces its fp16 gradient between them once a step: 107,216,896 B over a
    two-rank ring on one GPU's share of the NIC (587.5 MB/s, 50 µs): 107,216,896 / 587.5e6 + 2 · 50e-6
    = 0.18260 s. Without pipelining there is nothing to sync."""
    from dataclasses import replace

    from planner.cost.runtimes import PRIOR_FIGURES, price_under

    def dp_comm(row: dict, tied: bool) -> float:
        case = bench.build_case(dict(row, measurement_kind="measured real trial", iteration_time_s="1.2"))
        rt = replace(case.profile.overlap, tied_embedding_allreduce=tied)
        prof = replace(case.profile, overlap=rt)
        return price_under(case.plan, case.model, case.cluster, prof, PRIOR_FIGURES, restack=False).dp_comm_s

    piped = dict(AMP, micro_batch="1", tp="1", pp="4", dp="4")
    sync = 52352 * 1024 * 2 / (50e9 / 8 / 4 * 4.7 / 12.5) + 2 * 50e-6
    assert sync == pytest.approx(0.18260, abs=1e-5)
    assert dp_comm(piped, True) - dp_comm(piped, False) == pytest.approx(sync, rel=1e-3)
    flat = dict(AMP, micro_batch="1")
    assert dp_comm(flat, True) == dp_comm(flat, False)


def test_deepspeed_p2p_blocks_the_receiving_stage_too():
    """tp1 pp2 dp8, micro-batch 1, 4 micro-batches: stage 0 on nodes 0-1, stage 1 (the head's, the slowest)
    on nodes 2-3. Each boundary moves 2 MiB of activation + the 2 MiB fp16 mask forward and 2 MiB of
    gradient back on one GPU's NIC share (587.5 MB/s, 50 µs a message): 2·50e-6 + 6,291,456 / 587.5e6
    = 10.809 ms a micro-batch. DeepSpeed's broadcasts block the receiver as well, so the last stage,
    which sends nothing, spends 4 × 10.809 ms = 43.2 ms on p2p; without it, none."""
    from dataclasses import replace

    from planner.cost.runtimes import PRIOR_FIGURES, price_under

    row = dict(AMP, micro_batch="1", tp="1", pp="2", dp="8", measurement_kind="measured real trial")
    case = bench.build_case(dict(row, iteration_time_s="1.28"))

    def cost(blocks: bool):
        prof = replace(case.profile, overlap=replace(case.profile.overlap, p2p_blocks_receiver=blocks))
        return price_under(case.plan, case.model, case.cluster, prof, PRIOR_FIGURES, restack=False)

    boundary = 2 * 50e-6 + (2 * 2_097_152 + 2_097_152) / (50e9 / 8 / 4 * 4.7 / 12.5)
    assert boundary == pytest.approx(10.809e-3, rel=1e-4)
    both, sender = cost(True), cost(False)
    assert both.pp_comm_s == pytest.approx(4 * boundary, rel=1e-6)
    assert sender.pp_comm_s == 0.0
    assert both.step_time_s > sender.step_time_s


def test_deepspeed_last_stage_keeps_its_earlier_outputs():
    """DeepSpeed's last stage keeps the fp32 logits of the micro-batches before it in its two pipe buffers
    (Runtime.last_stage_keeps_outputs): min(m − 1, 2) copies at a forward. AMP's trial 47 shape (tp1 pp16
    dp1, micro-batch 16, 2 micro-batches): one copy of 16 · 1024 · 52352 (padded vocab) fp32 logits =
    3,430,940,672 B, × 1.1 (formulas.FRAGMENTATION_FRACTION) on the last stage's peak, nothing elsewhere."""
    from dataclasses import replace

    from planner.cost import formulas as F
    from planner.cost.memory import Stack, kept_output_bytes
    from planner.cost.runtimes import PRIOR_FIGURES, price_under

    assert [F.stale_output_copies(m) for m in (1, 2, 3, 8)] == [0, 1, 2, 2]
    row = dict(AMP, micro_batch="16", tp="1", pp="16", dp="1")
    case = bench.build_case(row)
    logits = 4 * 16 * 1024 * 52352
    assert logits == 3_430_940_672
    assert kept_output_bytes(case.model, 16, 1024, 1, "fp16", Stack(loss="vocab-parallel")) == logits

    def peaks(keeps: bool) -> tuple[int, ...]:
        prof = replace(case.profile, overlap=replace(case.profile.overlap, last_stage_keeps_outputs=keeps))
        return price_under(case.plan, case.model, case.cluster, prof, PRIOR_FIGURES, restack=False).peak_memory_bytes

    kept, freed = peaks(True), peaks(False)
    assert kept[-1] - freed[-1] == pytest.approx(1.1 * logits, abs=2)
    assert kept[:-1] == freed[:-1]


def test_eager_module_loading_and_t4_ecc_capacity():
    """A stack from before lazy CUDA module loading (AMP's) loses 666,632,192 − 287,047,680 = 379,584,512 B
    more to the CUDA context on every GPU (pytorch/pytorch#86509); a T4 with ECC holds 15,109 MiB."""
    from dataclasses import replace

    from planner.cost.runtimes import PRIOR_FIGURES, price_under

    case = bench.build_case(dict(AMP, micro_batch="1", tp="1", pp="4", dp="4"))

    def cost(eager: bool):
        prof = replace(case.profile, overlap=replace(case.profile.overlap, eager_module_loading=eager))
        return price_under(case.plan, case.model, case.cluster, prof, PRIOR_FIGURES, restack=False)

    eager, lazy = cost(True), cost(False)
    assert [e - z for e, z in zip(eager.peak_memory_bytes, lazy.peak_memory_bytes, strict=True)] == pytest.approx(
        [379_584_512] * 4, abs=1
    )
    assert set(eager.memory_capacity_bytes) == {15109 * 2**20}
