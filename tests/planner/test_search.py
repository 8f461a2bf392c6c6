"""Search behaviour: heterogeneity, leaving devices out, unequal shares, infeasibility, scale."""

from pathlib import Path

import pytest

from planner.search import SearchSpace, search
from planner.search.classes import device_classes
from planner.search.replicas import water_fill
from planner.search.search import SearchStats
from planner.specs.cluster import parse_cluster, parse_cluster_toml
from planner.specs.model import ModelSpec, get_model

EXAMPLES = Path(__file__).parents[2] / "examples" / "clusters"


def node(name, device, n, link, count=1, inter="ib-hdr"):
    return {"name": name, "device": device, "num_devices": n, "count": count, "intra_link": link, "inter_link": inter}


def kind_of(cluster):
    devs = cluster.devices()
    return lambda i: devs[i].kind


def test_faster_device_kind_gets_more_layers():
    cluster = parse_cluster(
        {"name": "hv", "nodes": [node("h", "H100-SXM5-80GB", 1, "nvlink4"), node("v", "V100-SXM2-32GB", 1, "nvlink2")]}
    )
    model = get_model("gpt3-1.3b")
    res = search(model, cluster, global_batch=32, space=SearchSpace(families=("pipeline",)), baselines=False)
    kind = kind_of(cluster)
    mixed = [p for p in res.plans if len({kind(s.device_ids[0]) for s in p.stages}) == 2]
    assert mixed, "expected a pipeline over both kinds among the top plans"
    for p in mixed:
        layers = {kind(s.device_ids[0]): s.num_layers for s in p.stages}
        assert layers["H100-SXM5-80GB"] > layers["V100-SXM2-32GB"]


def test_device_kind_too_slow_to_help_is_left_out():
    cluster = parse_cluster(
        {
            "name": "ht",
            "nodes": [
                node("h", "H100-SXM5-80GB", 8, "nvlink4", inter="eth-10g"),
                node("t", "T4", 4, "pcie3", inter="eth-10g"),
            ],
        }
    )
    res = search(get_model("gpt3-1.3b"), cluster, global_batch=64, baselines=False)
    kind = kind_of(cluster)
    used = {kind(d) for s in res.best.stages for d in s.device_ids}
    assert used == {"H100-SXM5-80GB"}


def test_unequal_replicas_get_unequal_batch_shares():
    cluster = parse_cluster(
        {"name": "av", "nodes": [node("a", "A100-SXM4-80GB", 2, "nvlink3"), node("v", "V100-SXM2-32GB", 2, "nvlink2")]}
    )
    res = search(
        get_model("gpt2-medium"), cluster, global_batch=64, space=SearchSpace(families=("replicas",)), baselines=False
    )
    best = res.best
    kind = kind_of(cluster)
    by_kind = {}
    for r, share in enumerate(best.batch_shares):
        by_kind.setdefault(kind(best.stages[0].replica_devices(r)[0]), []).append(share)
    assert set(by_kind) == {"A100-SXM4-80GB", "V100-SXM2-32GB"}
    assert min(by_kind["A100-SXM4-80GB"]) > max(by_kind["V100-SXM2-32GB"])


def test_water_fill_gives_faster_replicas_more_microbatches_and_is_optimal():
    S, X = [1.0, 3.0, 3.0], [1.0, 3.0, 3.0]
    m = water_fill(S[:2], X[:2], [1, 2], 9)
    assert sum(m) == 9 and m[0] > m[1] and m[0] > m[2]

    def finish(v):
        return max(S[r] + (v[r] - 1) * X[r] for r in range(3))

    brute = min(finish((a, b, 9 - a - b)) for a in range(1, 8) for b in range(1, 9 - a))
    assert finish(m) == brute


def test_infeasible_model_gives_reasons_with_numbers():
    cluster = parse_cluster({"name": "small", "nodes": [node("a", "A100-SXM4-40GB", 8, "nvlink3")]})
    res = search(get_model("gpt3-175b"), cluster, global_batch=8, baselines=False)
    assert not res.feasible
    text = " ".join(res.reasons)
    assert "gpt3-175b needs" in text and "GiB per device" in text and "largest device has 40 GiB" in text


def test_bad_batch_gives_a_reason():
    cluster = parse_cluster({"name": "one", "nodes": [node("a", "A100-SXM4-80GB", 1, "nvlink3")]})
    res = search(
        get_model("tiny"), cluster, global_batch=3, space=SearchSpace(micro_batch_sizes=(2, 4)), baselines=False
    )
    assert not res.feasible and any("multiple of any micro-batch" in r for r in res.reasons)


def test_identical_node_groups_merge_into_one_class():
    cluster = parse_cluster(
        {
            "name": "two",
            "nodes": [
                node("a", "A100-SXM4-80GB", 8, "nvlink3", count=3),
                node("b", "A100-SXM4-80GB", 8, "nvlink3", count=5),
            ],
        }
    )
    (cls,) = device_classes(cluster)
    assert cls.num_devices == 64 and cls.ids(20, 8) == list(range(20, 28))


def test_search_on_1024_mixed_gpus_beats_both_baselines():
    # how fast is bench/search.py's to say (ratios in one run), not a timed assertion here
    cluster = parse_cluster_toml((EXAMPLES / "h100-a100-1024.toml").read_text())
    res = search(get_model("gpt3-175b"), cluster, global_batch=1536, time_budget_s=2.0)
    assert res.feasible
    real = {d.id for d in cluster.devices()}
    assert all(d in real for s in res.best.stages for d in s.device_ids)
    assert res.best.provenance.algorithm and res.best.provenance.cost_model_version
    assert res.speedup("megatron") > 1.0 and res.speedup("uniform") >= 0.999


def test_time_budget_makes_the_search_anytime():
    cluster = parse_cluster_toml((EXAMPLES / "h100-a100-1024.toml").read_text())
    res = search(get_model("llama3-70b"), cluster, global_batch=512, time_budget_s=0.05, baselines=False)
    assert res.feasible and res.stats.timed_out
    # cut, not finished late: it priced fewer candidates than the complete search and says how far
    # its best can be from the optimum (counts, not seconds: no timed assertion on a shared box)
    full = search(get_model("llama3-70b"), cluster, global_batch=512, time_budget_s=float("inf"), baselines=False)
    assert full.stats.complete and not res.stats.complete
    assert res.stats.candidates < full.stats.candidates
    assert res.best.predicted.step_time_s >= full.best.predicted.step_time_s * (1 - 1e-12)
    assert res.stats.gap_fraction >= 0.0 and res.stats.summary().startswith("search cut by")


def test_homogeneous_search_never_loses_to_megatron_rule_of_thumb():
    cluster = parse_cluster_toml((EXAMPLES / "a100-8x8-ib200.toml").read_text())
    res = search(get_model("gpt3-13b"), cluster, global_batch=256, time_budget_s=3.0)
    assert res.speedup("megatron") >= 1.0


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
def test_tiny_models_on_cpu_ranks(model):
    cluster = parse_cluster(
        {
            "name": "cpu",
            "nodes": [
                {
                    "name": "cpu",
                    "device": "cpu",
                    "num_devices": 2,
                    "intra_link": {"kind": "loopback", "bandwidth_bytes_per_s": 5e9},
                    "inter_link": "eth-10g",
                    "device_memory_bytes": 8 * 2**30,
                    "device_peak_flop_per_s": 5e10,
                    "device_memory_bandwidth_bytes_per_s": 1e10,
                }
            ],
        }
    )
    res = search(get_model(model), cluster, global_batch=4)
    assert res.feasible and res.best.predicted.mfu > 0


def test_gqa_model_uses_tp_dividing_kv_heads():
    m = ModelSpec(
        name="gqa", family="llama", num_layers=4, hidden=256, num_heads=8, num_kv_heads=2, vocab_size=512, seq_len=128
    )
    cluster = parse_cluster({"name": "a", "nodes": [node("a", "A100-SXM4-80GB", 8, "nvlink3")]})
    res = search(m, cluster, global_batch=8, baselines=False, top_k=10)
    assert all(2 % s.tp == 0 for p in res.plans for s in p.stages)


def _gpt_1p4b_av(num_gpus: int):
    """Issue #18's problem: a 1.4B GPT on half A100-40GB, half V100-16GB, 4 GPUs a node."""
    half = num_gpus // 2 // 4
    cluster = parse_cluster(
        {
            "name": f"av{num_gpus}",
            "nodes": [
                node("a", "A100-SXM4-40GB", 4, "nvlink3", count=half),
                node("v", "V100-SXM2-16GB", 4, "nvlink2", count=half),
            ],
        }
    )
    model = ModelSpec(name="gpt-1.4b", num_layers=24, hidden=2048, num_heads=16, vocab_size=50304, seq_len=2048)
    return model, cluster, 2 * num_gpus


def test_complete_search_says_so_and_a_cut_one_bounds_what_it_missed():
    model, cluster, gb = _gpt_1p4b_av(16)
    full = search(model, cluster, global_batch=gb, time_budget_s=1e9, baselines=False)
    assert full.stats.complete and full.stats.gap_fraction == 0.0 and not full.stats.timed_out
    assert full.stats.best_s == pytest.approx(full.best.predicted.step_time_s, rel=1e-9)
    assert "complete" in full.stats.summary()
    cut = search(model, cluster, global_batch=gb, time_budget_s=0.02, baselines=False)
    assert cut.stats.timed_out
    if cut.stats.complete:  # what the budget dropped could not have won
        assert cut.best.predicted.step_time_s == pytest.approx(full.best.predicted.step_time_s, rel=1e-9)
    elif cut.stats.best_s is None:  # a loaded machine passed the hard stop (10× budget) before any plan
        assert not cut.feasible and "before any plan" in cut.stats.summary()
    else:  # the optimum is no faster than the bound on the unexplored plans, and the gap says by how much
        s = cut.stats
        assert s.unexplored_bound_s is not None and s.unexplored_bound_s <= full.best.predicted.step_time_s * (1 + 1e-9)
        assert s.gap_fraction == pytest.approx((s.best_s - s.unexplored_bound_s) / s.best_s)
        assert s.best_s >= full.best.predicted.step_time_s * (1 - 1e-9)
        assert "gap" in s.summary()


def test_a_search_cut_before_any_plan_says_so():
    """The hard stop (10× budget) can cut a search on a loaded machine before it found a plan, with
    a finite bound left on the frontier: the summary must not try to print the missing best plan."""
    stats = SearchStats(complete=False, best_s=None, unexplored_bound_s=1.5, timed_out=True)
    assert "before any plan" in stats.summary()


def test_a_device_count_keeps_only_plans_on_every_device():
    """SearchSpace.num_devices (`plan` after a several-node discovery): on 2 nodes × 2 CPU ranks with a
    slow link the fastest plan is one rank; asked for all 4, every ranked plan uses all 4, node-major."""
    text = (Path(__file__).parents[1] / "data" / "cpu-2nodes.toml").read_text()
    cluster = parse_cluster_toml(text.replace("num_devices = 1", "num_devices = 2").replace("2e9", "2e6"), "c")
    free = search(get_model("tiny"), cluster, global_batch=6, seq=32, dtype="fp32", time_budget_s=5)
    assert free.best.num_devices < 4
    whole = search(
        get_model("tiny"), cluster, global_batch=6, seq=32, dtype="fp32", time_budget_s=5,
        space=SearchSpace(num_devices=4),
    )  # fmt: skip
    assert whole.plans and all(p.num_devices == 4 for p in whole.plans)
    assert sorted(d for s in whole.best.stages for d in s.device_ids) == [0, 1, 2, 3]
