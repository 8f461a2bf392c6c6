"""Where a job's speed on an allocation comes from: the planner's cost model, or a table of measured times.

A `SpeedSource` lists, for a job, every allocation it could run on with the iteration time and the
plan that achieves it (`Price`); `None`/absent means "does not fit". The scheduler never assumes
linear scaling: the speed of (job, allocation) is whatever the source says, which is why the plan
and the allocation are chosen together. Both sources cache per (job's model and batch, allocation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from planner.scheduler.types import Allocation, ClusterState, Job, kind_alias
from planner.search import search
from planner.specs.cluster import ClusterSpec, NodeSpec
from planner.specs.config import SEARCH_BUDGET_S
from planner.specs.model import ModelSpec, get_model
from planner.specs.plan import Plan


@dataclass(frozen=True, slots=True)
class Price:
    alloc: Allocation
    iter_time_s: float
    plan: str


class SpeedSource(Protocol):
    queries: int

    def options(self, job: Job, cluster: ClusterState) -> list[Price]: ...

    def price(self, job: Job, alloc: Allocation) -> Price | None: ...


def _fits_cluster(alloc: Allocation, cluster: ClusterState) -> bool:
    return alloc.per_node <= cluster.max_per_node(alloc.kind) and alloc.count <= cluster.total(alloc.kind)


class TableSpeed:
    """Measured iteration times: rows (model key, kind, count, nodes, per-node, iter_time_s or None)."""

    def __init__(self, rows: list[tuple[str, str, int, int, int, float | None]], plan_label: str = "measured") -> None:
        self._by_model: dict[str, list[Price]] = {}
        for model, kind, count, nodes, per_node, t in rows:
            if t is None or t <= 0:
                continue
            assert nodes * per_node == count, f"table row {model}/{kind}: {nodes}×{per_node} ≠ {count}"
            self._by_model.setdefault(model, []).append(Price(Allocation(kind, count, nodes), t, plan_label))
        self.queries = 0
        self._cache: dict[tuple[str, tuple[str, ...], tuple], list[Price]] = {}

    def models(self) -> set[str]:
        return set(self._by_model)

    def options(self, job: Job, cluster: ClusterState) -> list[Price]:
        key = (job.model, job.kinds, cluster.shape)
        hit = self._cache.get(key)
        if hit is None:
            self.queries += 1
            hit = [
                p
                for p in self._by_model.get(job.model, [])
                if job.allows(p.alloc.kind) and _fits_cluster(p.alloc, cluster)
            ]
            self._cache[key] = hit
        return hit

    def iter_time_s(self, job: Job, alloc: Allocation) -> float | None:
        p = self.price(job, alloc)
        return p.iter_time_s if p is not None else None

    def price(self, job: Job, alloc: Allocation) -> Price | None:
        """The measured price of exactly `alloc` (a running job's), or None when the table lacks it."""
        return next((p for p in self._by_model.get(job.model, []) if p.alloc == alloc), None)


class PlannerSpeed:
    """meshplan's own price: `planner.search` on a cluster made of the allocation's nodes.

    `templates` maps a kind to the NodeSpec it is cut from (device, links); counts are powers of two
    packed on the fewest nodes, because that is where the planner's plans (tp inside a node, pp/dp
    across) are fastest and the options stay few. `time_budget_s` bounds each search; results are
    cached per (model's dimensions, batch, seq, allocation), so a round re-prices nothing it priced before.
    """

    def __init__(
        self, templates: dict[str, NodeSpec], time_budget_s: float = SEARCH_BUDGET_S, max_count: int = 64
    ) -> None:
        self.templates = templates
        self.time_budget_s = time_budget_s
        self.max_count = max_count
        self.queries = 0
        self._cache: dict[tuple[str, int, int | None, Allocation], Price | None] = {}
        self._plans: dict[tuple[str, int, int | None, Allocation], Plan | None] = {}

    @staticmethod
    def model_of(job: Job) -> ModelSpec:
        """The model the job trains: its dimensions, or its preset's (an unknown name fails with suggestions)."""
        return job.spec if job.spec is not None else get_model(job.model)

    def _key(self, job: Job, alloc: Allocation) -> tuple[str, int, int | None, Allocation]:
        # by the dimensions' fingerprint: two custom jobs both named "custom" are different models
        return (self.model_of(job).fingerprint(), job.global_batch, job.seq, alloc)

    @classmethod
    def from_cluster(cls, spec: ClusterSpec, **kw: float) -> PlannerSpeed:
        return cls({kind_alias(n.device_kind): n for n in spec.nodes}, **kw)  # type: ignore[arg-type]

    def allocations(self, job: Job, cluster: ClusterState) -> list[Allocation]:
        out = []
        for kind in cluster.kinds:
            if not job.allows(kind) or kind not in self.templates:
                continue
            per_node_max, count = cluster.max_per_node(kind), 1
            while count <= min(cluster.total(kind), self.max_count):
                per_node = min(count, per_node_max)
                if count % per_node == 0:
                    out.append(Allocation(kind, count, count // per_node))
                count *= 2
        return out

    def best_plan(self, job: Job, alloc: Allocation) -> Plan | None:
        """The searched plan behind `price` (launchable ones rank first), on the allocation's devices 0..n−1."""
        key = self._key(job, alloc)
        if key not in self._plans:
            self.queries += 1
            node = self.templates[alloc.kind].model_copy(
                update={"num_devices": alloc.per_node, "count": alloc.num_nodes}
            )
            spec = ClusterSpec(name=f"alloc-{alloc.kind}-{alloc.count}", nodes=(node,))
            res = search(
                self.model_of(job),
                spec,
                global_batch=job.global_batch,
                seq=job.seq,
                top_k=1,
                time_budget_s=self.time_budget_s,
                baselines=False,
            )
            self._plans[key] = res.best if res.feasible else None  # type: ignore[union-attr]
        return self._plans[key]

    def price(self, job: Job, alloc: Allocation) -> Price | None:
        key = self._key(job, alloc)
        if key in self._cache:
            return self._cache[key]
        best = self.best_plan(job, alloc)
        price = None
        if best is not None:
            assert best.predicted is not None
            price = Price(alloc, best.predicted.step_time_s, _describe(best))
        self._cache[key] = price
        return price

    def options(self, job: Job, cluster: ClusterState) -> list[Price]:
        return [p for a in self.allocations(job, cluster) if (p := self.price(job, a)) is not None]


def _describe(plan: object) -> str:
    stages = getattr(plan, "stages", ())
    parts = [f"pp={len(stages)}"]
    if stages:
        s0 = stages[0]
        parts += [f"tp={getattr(s0, 'tp', '?')}", f"dp={getattr(s0, 'dp', '?')}"]
    return " ".join(parts)
