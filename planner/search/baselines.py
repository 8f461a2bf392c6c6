"""Baselines priced beside every search, with the same cost model.

- Megatron rule of thumb (Narayanan et al. SC'21 §3.3 takeaways): TP = GPUs per node, PP across
  nodes, the smallest pipeline depth dividing the layers that fits in memory, uniform layers, 1F1B,
  micro-batch 1, DP over the rest; devices taken in id order as if identical (Megatron's rank order
  tp → dp → pp). If nothing fits, full recompute and then the distributed optimizer (ZeRO-1) are
  switched on, as a Megatron user would.
- Uniform: the best plan's pp, tp, micro-batch, schedule and sharding, but even layers and batch
  shares over all devices in id order — the plan a heterogeneity-blind planner would pick.
"""

from __future__ import annotations

from planner.cost.devices import DeviceIndex
from planner.cost.runtimes import Pricing, price
from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.search.build import balanced_microbatches
from planner.search.replicas import even_split
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, Provenance, StagePlan


def _layout(
    model: ModelSpec,
    name: str,
    cluster: str,
    *,
    pp: int,
    tp: int,
    dp: int,
    mbs: int,
    gb: int,
    seq: int,
    dtype: str,
    schedule: str,
    recompute: str,
    sharding: str,
    algorithm: str,
) -> Plan:
    split = even_split(model.num_layers, pp)
    stages, start, w = [], 0, dp * tp
    for s, n in enumerate(split):
        stages.append(
            StagePlan(
                layer_start=start,
                layer_end=start + n,
                device_ids=tuple(range(s * w, (s + 1) * w)),
                tp=tp,
                dp=dp,
                recompute=recompute,
                sharding=sharding,  # type: ignore[arg-type]
            )
        )
        start += n
    shares = tuple(k * mbs for k in balanced_microbatches(gb // mbs, dp))
    return Plan(
        model=name,
        cluster=cluster,
        global_batch_size=gb,
        seq_len=seq,
        micro_batch_size=mbs,
        schedule=schedule,  # type: ignore[arg-type]
        dtype=dtype,
        stages=tuple(stages),
        batch_shares=shares,
        provenance=Provenance(algorithm=algorithm),  # type: ignore[arg-type]
    )


def megatron_baseline(
    model: ModelSpec,
    cluster: ClusterSpec,
    table: ProfileTable,
    *,
    global_batch: int,
    seq: int,
    dtype: str,
    index: DeviceIndex | None = None,
    calibration: Calibration | None = None,
    pricing: Pricing | None = None,
) -> Plan | None:
    node = min(n.num_devices for n in cluster.nodes)
    tps = [t for t in range(node, 0, -1) if node % t == 0 and model.num_heads % t == 0 and model.kv_heads % t == 0]
    tp, n = tps[0], cluster.num_devices
    idx = index or DeviceIndex(cluster)
    for recompute, sharding in (("none", "none"), ("full", "none"), ("full", "zero1")):
        for pp in (p for p in range(1, model.num_layers + 1) if model.num_layers % p == 0 and tp * p <= n):
            dp = min(n // (tp * pp), global_batch)
            if _states_cannot_fit(model, cluster, tp, pp, dp, sharding, dtype):
                continue
            plan = _layout(
                model,
                model.name,
                cluster.name,
                pp=pp,
                tp=tp,
                dp=dp,
                mbs=1,
                gb=global_batch,
                seq=seq,
                dtype=dtype,
                schedule="1f1b",
                recompute=recompute,
                sharding=sharding,
                algorithm="baseline-megatron",
            )
            plan = pricing.dress(plan) if pricing is not None else plan  # as the runtime runs it
            cost = price(plan, model, cluster, pricing, profiles=table, index=idx, calibration=calibration)
            if cost.feasible:
                return plan.model_copy(update={"predicted": cost})
    return None


def _states_cannot_fit(
    model: ModelSpec, cluster: ClusterSpec, tp: int, pp: int, dp: int, sharding: str, dtype: str
) -> bool:
    """Cheap pre-check: the busiest stage's weights, grads and Adam states alone exceed the largest device."""
    from planner.cost import formulas as F

    per_stage = model.num_params() / (tp * pp) * F.state_bytes_per_param(dtype, sharding, dp)
    return per_stage > max(nd.memory_bytes for nd in cluster.nodes)


def uniform_baseline(
    best: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    table: ProfileTable,
    index: DeviceIndex | None = None,
    calibration: Calibration | None = None,
    pricing: Pricing | None = None,
) -> Plan | None:
    tp, pp, mbs = min(s.tp for s in best.stages), best.pp, best.micro_batch_size
    dp = min(cluster.num_devices // (tp * pp), best.global_batch_size // mbs)
    if dp < 1:
        return None
    idx = index or DeviceIndex(cluster)
    last = None
    for recompute in ("none", "full"):
        plan = _layout(
            model,
            best.model,
            best.cluster,
            pp=pp,
            tp=tp,
            dp=dp,
            mbs=mbs,
            gb=best.global_batch_size,
            seq=best.seq_len,
            dtype=best.dtype,
            schedule=best.schedule,
            recompute=recompute,
            sharding=best.stages[0].sharding,
            algorithm="baseline-uniform",
        )
        plan = pricing.dress(plan) if pricing is not None else plan  # as the runtime runs it
        cost = price(plan, model, cluster, pricing, profiles=table, index=idx, calibration=calibration)
        last = plan.model_copy(update={"predicted": cost})
        if last.predicted.feasible:  # type: ignore[union-attr]
            return last
    return last
