"""The search's pruning bounds (planner/search/bounds.py) never exceed what they bound.

Each bound is checked against brute force on random stage arrays: every split of L blocks within the
memory caps, priced with the inner solver's cost (w_sum·Σ τ + w_max·max τ + max Z), and every share
vector of the replica pool. A bound above the true optimum would let the search prune the optimum.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.search.arrays import mix_prefix
from planner.search.bounds import (
    capped_parts,
    capped_replica_bound,
    capped_replica_bounds,
    capped_row,
    capped_split_bound,
    pool_bound,
    prefix_bounds,
    split_bound,
)
from planner.search.inner import StageArrays, solve_split
from planner.search.oracle import compositions
from planner.search.replicas import water_fill


def brute_cost(s: StageArrays, num_layers: int, w_sum: float, w_max: float) -> float:
    best = math.inf
    for split in compositions(num_layers, len(s.a)):
        if not all(s.mem_ok[i, n - 1] for i, n in enumerate(split)):
            continue
        n = np.array(split, dtype=np.float64)
        t = s.a * n + s.b
        z = np.maximum(0.0, s.e0 + s.e1 * n) + s.z0 + s.z1 * n
        best = min(best, w_sum * t.sum() + w_max * t.max() + z.max())
    return best


@st.composite
def stage_pairs(draw):
    """Arrays without and with full recompute for p stages and L blocks (memory caps a prefix of n)."""
    p = draw(st.integers(1, 4))
    num_layers = draw(st.integers(p, 9))
    nmax = num_layers - p + 1
    pos = st.floats(0.05, 3.0)

    def arrays() -> StageArrays:
        vec = lambda s: np.array(draw(st.lists(s, min_size=p, max_size=p)))  # noqa: E731
        caps = vec(st.integers(0, nmax))
        return StageArrays(
            vec(pos),
            vec(st.floats(0.0, 3.0)),
            vec(st.floats(-3.0, 1.0)),  # e: exposed sync, may be hidden (negative) before the hinge
            vec(st.floats(-1.0, 1.0)),
            vec(st.floats(0.0, 1.0)),
            vec(st.floats(0.0, 0.5)),
            np.arange(1, nmax + 1)[None, :] <= caps[:, None],
        )

    w_max = draw(st.floats(0.0, 12.0))
    w_sum = draw(st.sampled_from([1.0, 0.5]))
    return arrays(), arrays(), num_layers, w_sum, w_max


@settings(max_examples=300, deadline=None)
@given(stage_pairs())
def test_candidate_bounds_never_exceed_the_cheapest_split(case):
    none, full, num_layers, w_sum, w_max = case
    ks = list(range(len(none.a) + 1))
    bounds = prefix_bounds(none, full, ks, num_layers, w_sum, w_max)
    for k, lb in zip(ks, bounds, strict=True):
        arr = mix_prefix(none, full, k)
        best = brute_cost(arr, num_layers, w_sum, w_max)
        assert math.isinf(lb) == math.isinf(best)  # +inf exactly when no split fits in memory
        if math.isinf(best):
            continue
        assert lb <= best * (1 + 1e-12)
        assert capped_split_bound(arr, num_layers, w_sum, w_max) == lb
        assert split_bound(arr, num_layers, w_sum, w_max) <= lb * (1 + 1e-12)  # the caps only tighten it
        caps = [int(c) for c in arr.mem_ok.sum(axis=1)]
        row = capped_row(list(arr.a), list(arr.b), caps, num_layers, w_sum, w_max)  # the node bound: no tail
        rows = [x[None, :] for x in (arr.a, arr.b, arr.e0, arr.e1, arr.z0, arr.z1)]
        total, worst, _, _ = capped_parts(*rows, np.array([caps], dtype=np.float64), num_layers)
        assert row == pytest.approx(w_sum * total[0] + w_max * worst[0], rel=1e-9)
        sol = solve_split(arr, num_layers, max(1, round(w_max) + 1), np.inf, w_sum, w_max)
        assert sol is not None and lb <= sol.cost_s * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.1, 5.0), st.floats(0.01, 2.0), st.integers(1, 3)), min_size=1, max_size=3),
    st.integers(1, 12),
)
def test_pool_bound_never_exceeds_the_water_filled_makespan(groups, extra):
    """Replicas of class c finish at S_c + (m_r − 1)·X_c; water-filling hands out exactly the total
    (it once returned more when every replica's first micro-batch already covered it: S = [1, 4],
    X = [1, 1], total 3 gave [3, 1]) and no share vector beats the pool bound."""
    S = [s for s, _, _ in groups]
    X = [x for _, x, _ in groups]
    counts = [n for _, _, n in groups]
    total = sum(counts) + extra
    shares = water_fill(S, X, counts, total)
    assert shares is not None and sum(shares) == total
    owner = [c for c, n in enumerate(counts) for _ in range(n)]
    makespan = max(S[c] + (m - 1) * X[c] for c, m in zip(owner, shares, strict=True))
    assert pool_bound(S, X, counts, total) <= makespan * (1 + 1e-12)
    if len(owner) <= 4 and total <= 12:  # and water-filling is optimal: no share vector finishes sooner
        best = min(
            max(S[c] + (m - 1) * X[c] for c, m in zip(owner, ms, strict=True)) for ms in compositions(total, len(owner))
        )
        assert makespan == best


@settings(max_examples=150, deadline=None)
@given(st.lists(stage_pairs(), min_size=1, max_size=3), st.lists(st.integers(1, 3), min_size=3, max_size=3))
def test_replica_bounds_of_all_prefixes_at_once_equal_one_prefix_at_a_time(cases, counts):
    """capped_replica_bounds (every recompute prefix in one capped_parts call, as the search runs it)
    gives each prefix the very bound capped_replica_bound gives its mixed arrays."""
    p, num_layers = len(cases[0][0].a), cases[0][2]
    groups = [c for c in cases if len(c[0].a) == p and c[2] == num_layers]  # the classes share one split
    none, full = [g[0] for g in groups], [g[1] for g in groups]
    loose_none, loose_full = full, none  # any arrays of the same shape serve as the loose ones
    ks = list(range(p + 1))
    n = counts[: len(groups)]
    total_mb = sum(n) + 3
    got = capped_replica_bounds(none, full, loose_none, loose_full, ks, n, num_layers, total_mb)
    for k, lb in zip(ks, got, strict=True):
        want = capped_replica_bound(
            [mix_prefix(a, b, k) for a, b in zip(none, full, strict=True)],
            [mix_prefix(a, b, k) for a, b in zip(loose_none, loose_full, strict=True)],
            n,
            num_layers,
            total_mb,
        )
        assert lb == want or (math.isinf(lb) and math.isinf(want))


def test_node_bounds_never_exceed_a_candidate_below_them(monkeypatch):
    """Every primary and interleaved node's bound (per recompute prefix, under memory caps, rank 0
    at its local slope) is ≤ the cost of every candidate solved below it, with nothing pruned."""
    from planner.search import explore as E
    from planner.search import search
    from planner.search.space import SearchSpace
    from planner.specs.cluster import parse_cluster
    from planner.specs.model import ModelSpec

    lbs: dict[tuple, float] = {}
    costs: dict[tuple, float] = {}
    monkeypatch.setattr(E.Explorer, "bound", lambda self: math.inf)  # solve everything

    def keep(name: str, v_of):
        orig = getattr(E.Explorer, name)

        def node(self, *args):
            push = self.push

            def wrapped(lb, run, leaf=False):
                lbs[(id(self), args[0], args[2], args[3], v_of(args))] = lb
                return push(lb, run, leaf)

            self.push = wrapped
            try:
                orig(self, *args)
            finally:
                del self.push

        monkeypatch.setattr(E.Explorer, name, node)

    keep("_primary_node", lambda a: 1)
    keep("_interleaved_node", lambda a: a[-1])
    record = E.Explorer.record

    def rec(self, cost, shape, choice):
        key = (id(self), shape, choice.mbs, choice.sharding, choice.virtual_stages)
        costs[key] = min(costs.get(key, math.inf), cost)
        record(self, cost, shape, choice)

    monkeypatch.setattr(E.Explorer, "record", rec)
    node = {"intra_link": "nvlink3", "inter_link": "ib-hdr", "num_devices": 2, "count": 2}
    cluster = parse_cluster(
        {
            "name": "two",
            "nodes": [
                {"name": "a", "device": "A100-SXM4-40GB", **node},
                {"name": "v", "device": "V100-SXM2-16GB", **node},
            ],
        }
    )
    model = ModelSpec(name="m", num_layers=8, hidden=2048, num_heads=16, vocab_size=32000, seq_len=2048)
    space = SearchSpace(micro_batch_sizes=(1, 2), shardings=("none", "zero2"), tps=(1, 2), families=("pipeline",))
    search(model, cluster, global_batch=16, space=space, baselines=False)
    solved = [k for k in lbs if k in costs]
    assert len(solved) > 10 and any(k[-1] > 1 for k in solved)
    assert all(lbs[k] <= costs[k] * (1 + 1e-9) for k in solved)


def test_shapes_dropped_for_memory_have_no_child(monkeypatch):
    """Bounds.shape_bounds drops (+inf) only shapes whose expansion would push nothing: for every
    dropped pipeline shape Bounds.optimistic finds no sharding's memory holding the model, for every
    dropped replica shape Bounds.optimistic_replicas; on a cluster too small for most layouts, so
    some of both are dropped and some are kept."""
    from planner.cost.devices import cross_node_link
    from planner.search import explore as E
    from planner.search import search
    from planner.search.arrays import SegmentSpec
    from planner.search.bounds import shape_table
    from planner.specs.cluster import parse_cluster
    from planner.specs.model import ModelSpec

    seen = {"pipeline": [0, 0], "replicas": [0, 0]}  # [dropped, kept]
    seed = E.Explorer.seed

    def check(self, shapes, table=None):
        tab = table if table is not None else shape_table(shapes)
        b = self.bounds
        for mbs in self.mbs_opts:
            total_mb = self.global_batch // mbs
            for sh, ok in zip(shapes, b._may_fit(tab, mbs).tolist(), strict=True):
                if total_mb < sh.dp:
                    continue
                seen[sh.family][ok] += 1
                if ok:
                    continue
                shard = self.shardings if sh.dp * self.pr.stack.cp > 1 else ["none"]
                if sh.family == "pipeline":
                    m = math.ceil(total_mb / sh.dp)
                    assert math.isinf(b.optimistic(self.segments(sh), m, mbs, self.primary, shard, sh.dp, [])[0])
                else:
                    tp = sh.segments[0].tp
                    link = self.pr.intern(cross_node_link([self.pr.classes[c].spec for c, _ in sh.groups]))
                    segs = [SegmentSpec(c, tp, sh.pp, n * tp, link) for c, n in sh.groups]
                    counts = [n for _, n in sh.groups]
                    assert math.isinf(b.optimistic_replicas(segs, counts, total_mb, mbs, shard, sh.dp))
        return seed(self, shapes, table)

    monkeypatch.setattr(E.Explorer, "seed", check)
    node = {"intra_link": "nvlink3", "inter_link": "ib-hdr", "num_devices": 4, "count": 1}
    cluster = parse_cluster(
        {
            "name": "small",
            "nodes": [
                {"name": "a", "device": "A100-SXM4-40GB", **node},
                {"name": "v", "device": "V100-SXM2-16GB", **node},
            ],
        }
    )
    model = ModelSpec(name="m", num_layers=16, hidden=5120, num_heads=40, vocab_size=32000, seq_len=2048)
    search(model, cluster, global_batch=64, baselines=False)
    assert all(dropped > 0 and kept > 0 for dropped, kept in seen.values()), seen


def test_sorted_unique_is_np_unique():
    import numpy as np

    from planner.search.inner import sorted_unique

    rng = np.random.default_rng(0)
    for _ in range(500):
        x = rng.integers(0, 20, rng.integers(0, 30)).astype(float) / 3
        x[rng.random(x.size) < 0.1] = np.inf
        x[rng.random(x.size) < 0.05] = -0.0
        assert np.array_equal(sorted_unique(x), np.unique(x))
