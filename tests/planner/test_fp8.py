"""fp8 linears (Plan.fp8): catalog peaks, memory and time terms pinned to hand counts, refusals, exports.

tiny: h = 64, a = 4 heads (kv = 4), ffn = 256, 4 blocks; b = 2, s = 64, bf16 (e = 2).
"""

import tomllib

import pytest

from planner.cost import compute as C
from planner.cost import estimate
from planner.cost import formulas as F
from planner.cost import memory as M
from planner.cost.estimate import gpu_device
from planner.errors import MeshplanError
from planner.report.export import to_megatron, to_torchtitan
from planner.runtime import launch_problems
from planner.specs.catalog import lookup
from planner.specs.cluster import parse_cluster
from planner.specs.model import get_model
from planner.specs.plan import Plan, StagePlan
from tests.planner.test_cost_memory import one_gpu, plan

TINY = get_model("tiny")


def test_catalog_has_fp8_peaks_from_the_datasheets_and_none_where_there_are_no_fp8_cores():
    assert lookup("H100-SXM5-80GB").peak_fp8_flop_per_s == pytest.approx(1979e12)
    assert lookup("L40S").peak_fp8_flop_per_s == pytest.approx(733e12)
    assert lookup("A100-SXM4-80GB").peak_fp8_flop_per_s is None
    assert lookup("T4").peak_fp8_flop_per_s is None
    node = {"name": "n", "device": "A100-SXM4-80GB", "num_devices": 1, "intra_link": "pcie4", "inter_link": "eth-100g"}
    inline = parse_cluster({"name": "c", "nodes": [dict(node, device_peak_fp8_flop_per_s=5e14)]})
    assert inline.nodes[0].peak_fp8_flop_per_s == 5e14


def test_fp8_keeps_linear_inputs_in_one_byte_and_one_fp8_weight_copy():
    # inputs the projections alone keep: 2 norm outputs 2·(2·64·64) + projection input 2·64·64 + fc2
    # input 2·64·256 = 16384 + 8192 + 32768 = 57344 elements, e − 1 = 1 byte saved each;
    # fp8 weights: qkv 64·192 + proj 64·64 + fc1/fc2 2·64·256 = 49152 bytes
    assert M.linear_weight_params(TINY, 1) == 49152
    assert M.fp8_linear_kept_delta_bytes(TINY, 2, 64, 1, "bf16", False) == pytest.approx(-57344 + 49152)
    # tp = 2, sequence parallel: norms 16384/2, the rest /2, weights /2
    assert M.fp8_linear_kept_delta_bytes(TINY, 2, 64, 2, "bf16", True) == pytest.approx(-(57344 / 2) + 49152 / 2)


def test_estimate_books_the_fp8_memory_delta_per_block():
    cluster = one_gpu("H100-SXM5-80GB")
    base, fp8 = (estimate(plan(fp8=f), TINY, cluster) for f in (False, True))
    delta = (fp8.peak_memory_bytes[0] - base.peak_memory_bytes[0]) / (1 + F.FRAGMENTATION_FRACTION)
    assert delta == pytest.approx(4 * (-57344 + 49152), abs=4)  # 4 blocks, one micro-batch in flight


def test_fp8_gemms_run_at_the_fp8_peak_and_pay_their_casts():
    dev = gpu_device(one_gpu("H100-SXM5-80GB").nodes[0], "bf16", None)
    assert C.fp8_cast_bytes_per_element(2) == 7  # amax read 2, cast read 2 + write 1, transpose 1 + 1
    # one large, compute-bound GEMM at twice the peak takes half the time
    big = 8192
    bf16 = C.gemm_s(big, big, big, 2, dev)
    fp8 = C.gemm_s(big, big, big, 1, C.replace(dev, peak_flop_per_s=dev.peak_fp8_flop_per_s), out_e=2)
    assert fp8 / bf16 == pytest.approx(989 / 1979)
    # by hand for tiny (memory-bound GEMMs): every term of fp8_linear_delta_s
    fwd = bwd = 0.0
    dev8 = C.replace(dev, peak_flop_per_s=dev.peak_fp8_flop_per_s)
    for m, n, k in [(128, 192, 64), (128, 64, 64), (128, 256, 64), (128, 64, 256)]:
        fwd += C.gemm_s(m, n, k, 1, dev8, out_e=2) - C.gemm_s(m, n, k, 2, dev) + C.memory_s(7 * (m * k + k * n), dev)
        g8 = C.gemm_s(m, k, n, 1, dev8, out_e=2) + C.gemm_s(k, n, m, 1, dev8, out_e=2)
        g2 = C.gemm_s(m, k, n, 2, dev) + C.gemm_s(k, n, m, 2, dev)
        bwd += g8 - g2 + C.memory_s(7 * m * n, dev)
    assert C.fp8_linear_delta_s(TINY, 2, 64, 1, "bf16", dev) == pytest.approx((fwd, bwd))


def test_fp8_pays_off_on_large_gemms_and_not_on_small_ones():
    """torchtitan's float8 note: faster only where GEMMs are large enough to outweigh the casts."""
    dev = gpu_device(one_gpu("H100-SXM5-80GB").nodes[0], "bf16", None)
    # h = 768: the forward's casts (7 bytes per input and weight element) outweigh its faster GEMMs
    f_small, _ = C.fp8_linear_delta_s(get_model("gpt2-small"), 4, 2048, 1, "bf16", dev)
    f_big, b_big = C.fp8_linear_delta_s(get_model("gpt3-13b"), 4, 2048, 1, "bf16", dev)
    assert f_small > 0 > f_big + b_big
    m = get_model("gpt3-13b")
    cluster = one_gpu("H100-SXM5-80GB")

    def step(fp8):
        p = plan(m, seq=2048, mbs=1, recompute="full", fp8=fp8)
        return estimate(p, m, cluster).step_time_s

    assert step(True) < step(False)


def test_fp8_is_refused_where_the_device_has_no_fp8_and_by_meshplans_runtime():
    with pytest.raises(MeshplanError, match="fp8 tensor cores"):
        estimate(plan(fp8=True), TINY, one_gpu("A100-SXM4-80GB"))
    assert any(q.field == "fp8" for q in launch_problems(plan(fp8=True)))
    with pytest.raises(ValueError, match="mixed precision"):  # pydantic wraps the MeshplanError
        plan(fp8=True, dtype="fp32")
    # a plan written before the field keeps its id
    assert plan().fingerprint() == plan(fp8=False).fingerprint() != plan(fp8=True).fingerprint()


def test_exports_turn_on_torchtitans_float8_converter_and_megatrons_fp8_format():
    stage = StagePlan(layer_start=0, layer_end=4, device_ids=(0, 1), dp=2)
    p = Plan(
        model="tiny",
        cluster="c",
        global_batch_size=4,
        seq_len=64,
        micro_batch_size=2,
        stages=(stage,),
        batch_shares=(2, 2),
        fp8=True,
    )
    toml = tomllib.loads(to_torchtitan(p)[0])
    assert toml["model"]["converters"] == ["float8"] and toml["float8"]["filter_fqns"] == ["output"]
    args = to_megatron(p, TINY)[0]
    assert "--fp8-format hybrid" in args and "--transformer-impl transformer_engine" in args
    assert "float8" not in to_torchtitan(p.model_copy(update={"fp8": False}))[0]
