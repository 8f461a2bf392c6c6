"""The search under the user's runtime (issue #42 item 5): `plan --runtime X` enumerates with X's
prices and memory (planner.cost.runtimes.Pricing: kernels, stack, overlap, fixed costs, calibrated
figures), bounds included, so it finds plans a search under meshplan's prices never keeps; and the
fast search equals the exhaustive oracle under every runtime of the table."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cost.runtimes import RUNTIME_NAMES, Figures, Pricing, price, profile_named
from planner.search import SearchSpace, search
from planner.search.oracle import oracle_search
from planner.specs.cluster import parse_cluster
from planner.specs.model import ModelSpec
from tests.planner.test_runtimes import CLUSTER, MODEL
from tests.planner.test_search_oracle import cheapest, instances


def layout(p) -> tuple:
    """What a plan decides besides the runtime's stack: micro-batch, schedule, and each stage's blocks,
    widths, recompute and sharding."""
    stages = tuple(
        (s.layer_start, s.layer_end, s.tp, s.dp, s.recompute, s.recompute_every, s.sharding) for s in p.stages
    )
    return p.micro_batch_size, p.schedule, p.virtual_stages, stages


def as_meshplan_runs_it(p):
    """The plan on meshplan's own stack (SDPA, torch loss on fp32 logits, no dropout)."""
    return p.model_copy(update={"attention": "sdpa", "loss": "torch", "dropout": False, "predicted": None})


def test_megatron_search_finds_a_plan_the_meshplan_search_never_kept():
    """8 blocks of a 2048-wide GPT at seq 4096 on four A100-40GB: Megatron's flash attention and
    fused loss keep less, so its best plan runs micro-batch 8 where meshplan's SDPA and fp32
    logits stop at 4. The search under Megatron finds it; meshplan's search ranks it lower (out of
    memory there) and keeps it nowhere in its top 5, so re-ranking those (the old `--runtime`) misses it."""
    mp_pricing, mg_pricing = Pricing(profile_named("meshplan")), Pricing(profile_named("megatron"))
    mp = search(MODEL, CLUSTER, global_batch=32, top_k=5, baselines=False, pricing=mp_pricing)
    mg = search(MODEL, CLUSTER, global_batch=32, top_k=5, baselines=False, pricing=mg_pricing)
    best = mg.best
    assert (best.attention, best.loss) == ("flash", "fused")  # as Megatron runs it (data/runtimes.toml)
    assert best.predicted == price(best.model_copy(update={"predicted": None}), MODEL, CLUSTER, mg_pricing)
    assert layout(best) not in {layout(p) for p in mp.plans}  # never kept by meshplan's search
    under_mp = price(as_meshplan_runs_it(best), MODEL, CLUSTER, mp_pricing)
    assert not under_mp.feasible or under_mp.step_time_s > mp.best.predicted.step_time_s  # ranked lower there
    reranked = [price(mg_pricing.dress(as_meshplan_runs_it(p)), MODEL, CLUSTER, mg_pricing) for p in mp.plans]
    assert min(c.step_time_s for c in reranked if c.feasible) > best.predicted.step_time_s


def test_plan_command_searches_under_the_runtime(tmp_path):
    """`meshplan plan --runtime megatron` (the command, in this process) answers the Megatron search's
    best plan, one that `--runtime meshplan` does not list."""
    from typer.testing import CliRunner

    from cli.main import app

    cluster = tmp_path / "c.toml"
    cluster.write_text(
        'name = "c"\n[[nodes]]\nname = "n"\ndevice = "A100-SXM4-40GB"\nnum_devices = 4\ncount = 1\n'
        'intra_link = "nvlink3"\ninter_link = "ib-hdr"\n'
    )
    model = ["--model", "custom", "--layers", "8", "--hidden", "2048", "--heads", "16", "--vocab", "50304"]
    model += ["--seq-len", "4096"]

    def plan(runtime: str) -> dict:
        args = ["--state-dir", str(tmp_path / "state"), "plan", "--cluster", str(cluster), *model]
        args += ["--global-batch", "32", "--top", "5", "--json", "--no-store", "--runtime", runtime]
        res = CliRunner().invoke(app, args, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    mg, mp = plan("megatron"), plan("meshplan")
    assert mg["runtime_figures"] == "uncalibrated: A100-SXM4-40GB/megatron"
    best = mg["plans"][0]
    assert best["attention"] == "flash" and best["micro_batch_size"] == 8
    assert all(p["micro_batch_size"] <= 4 for p in mp["plans"])


# the oracle's space, less GPipe (its pricing is 1F1B's here; the oracle's enumeration halves)
RT_SPACE = SearchSpace(micro_batch_sizes=(1, 2), schedules=("1f1b",), shardings=("none", "zero2"), tps=(1, 2))
FIGURES = [Figures(), Figures(kernel_scale=1.3, microbatch_s=0.004, runs=3, source="test", step_s=0.01)]


@pytest.mark.parametrize("runtime", RUNTIME_NAMES)
@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(), figures=st.sampled_from(FIGURES))
def test_fast_search_equals_the_oracle_under_every_runtime(runtime, inst, figures):
    """The oracle property (tests/planner/test_search_oracle.py) with every plan priced under the
    runtime and its figures (priors, or calibrated ones with fixed costs): the search's stage terms,
    p2p overlap and bounds price as `price` does."""
    cluster, model, gb = inst
    pricing = Pricing(profile_named(runtime), figures)
    oracle = oracle_search(model, cluster, global_batch=gb, space=RT_SPACE, pricing=pricing)
    fast = search(model, cluster, global_batch=gb, space=RT_SPACE, baselines=False, top_k=3, pricing=pricing)
    if oracle is None:
        assert not fast.feasible
        return
    assert fast.feasible
    assert cheapest(fast) == pytest.approx(oracle.predicted.step_time_s, rel=1e-9)


def test_interleaved_search_under_megatron_hides_its_p2p_as_the_oracle_prices_it():
    """Megatron overlaps p2p in the interleaved schedule only (planner.cost.overlap): over a slow link
    that makes interleaving win under Megatron, and the search's arrays hide it as `price` does."""
    node = {"name": "a", "device": "A100-SXM4-40GB", "num_devices": 1, "count": 2}
    cluster = parse_cluster({"name": "two", "nodes": [dict(node, intra_link="nvlink3", inter_link="eth-10g")]})
    model = ModelSpec(name="m", num_layers=6, hidden=2048, num_heads=4, vocab_size=512, seq_len=128)
    space = SearchSpace(micro_batch_sizes=(1,), shardings=("none",), tps=(1,), families=("pipeline",))
    for figures in FIGURES:  # the calibrated ones: a rank's micro-batch cost, 1/v a chunk (stage.Overheads)
        pricing = Pricing(profile_named("megatron"), figures)
        oracle = oracle_search(model, cluster, global_batch=4, space=space, pricing=pricing)
        fast = search(model, cluster, global_batch=4, space=space, baselines=False, top_k=1, pricing=pricing)
        assert cheapest(fast) == pytest.approx(oracle.predicted.step_time_s, rel=1e-9)
        assert fast.best.schedule == "interleaved-1f1b"
