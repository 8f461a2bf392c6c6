"""A picture of the pipeline schedule: simulate GPipe / 1F1B on per-stage times, draw a Gantt chart.

The simulation is an event list: stage i runs its operations in schedule order, and an operation
starts when its stage is free and its input exists — F(i, j) needs F(i−1, j), B(i, j) needs
B(i+1, j) and F(i, j). 1F1B order for stage i of p with m micro-batches (Narayanan et al. SC'21):
min(p−i−1, m) warm-up forwards, then one forward / one backward pairs, then the remaining
backwards; GPipe runs all forwards, then all backwards. With equal stages (f, b) and no
communication the makespan is (m + p − 1)(f + b), the bubble formula the cost model prices —
tests/planner/test_timeline.py checks the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.specs.plan import Plan


@dataclass(frozen=True, slots=True)
class Op:
    stage: int
    microbatch: int
    kind: str  # "F" or "B"
    start_s: float
    end_s: float


def _order(schedule: str, stage: int, pp: int, m: int) -> list[tuple[str, int]]:
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    warm = min(pp - stage - 1, m)
    ops = [("F", j) for j in range(warm)]
    f = warm
    for b in range(m):
        if f < m:
            ops.append(("F", f))
            f += 1
        ops.append(("B", b))
    return ops


def simulate(schedule: str, forward_s: list[float], backward_s: list[float], m: int, p2p_s: float = 0.0) -> list[Op]:
    """Every operation of one replica's step, with start and end times."""
    pp = len(forward_s)
    orders = [_order(schedule, i, pp, m) for i in range(pp)]
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * pp
    nxt = [0] * pp
    ops: list[Op] = []
    while any(nxt[i] < len(orders[i]) for i in range(pp)):
        progressed = False
        for i in range(pp):
            if nxt[i] >= len(orders[i]):
                continue
            kind, j = orders[i][nxt[i]]
            deps = [("F", i - 1, j)] if kind == "F" and i > 0 else []
            if kind == "B":
                deps = [("F", i, j)] + ([("B", i + 1, j)] if i < pp - 1 else [])
            if not all(d in done for d in deps):
                continue
            ready = max([free[i]] + [done[d] + (p2p_s if d[1] != i else 0.0) for d in deps])
            dur = forward_s[i] if kind == "F" else backward_s[i]
            ops.append(Op(i, j, kind, ready, ready + dur))
            done[(kind, i, j)] = free[i] = ready + dur
            nxt[i] += 1
            progressed = True
        assert progressed, "schedule deadlocked"  # internal invariant: the orders above never deadlock
    return ops


def stage_times(plan: Plan, profiles, replica: int = 0) -> tuple[list[float], list[float]]:
    """Per-stage forward and backward seconds per micro-batch from profile rows (compute only).

    `profiles` maps a stage's (layer kind, recompute, device index) to a LayerProfile through its
    `lookup_stage(stage, kind)` callable — see flows/plan.py — so this module stays free of the
    cost model's internals.
    """
    fwd, bwd = [], []
    for s in plan.stages[: plan.pp]:
        f = b = 0.0
        kinds = ["block"] * s.num_layers
        if s is plan.stages[0]:
            kinds.append("embedding")
        if s is plan.stages[plan.pp - 1]:
            kinds.append("head")
        for kind in kinds:
            row = profiles(s, kind, replica)
            f += row.forward_s
            b += row.backward_s
        fwd.append(f)
        bwd.append(b)
    return fwd, bwd


def gantt(ops: list[Op], width: int = 72) -> str:
    """A text Gantt chart: one row per stage, forwards as digits of the micro-batch, backwards as letters."""
    end = max(o.end_s for o in ops)
    pp = max(o.stage for o in ops) + 1
    rows = [[" "] * width for _ in range(pp)]
    for o in ops:
        a, b = int(o.start_s / end * width), max(int(o.start_s / end * width) + 1, int(o.end_s / end * width))
        ch = str(o.microbatch % 10) if o.kind == "F" else "abcdefghij"[o.microbatch % 10]
        for x in range(a, min(b, width)):
            rows[o.stage][x] = ch
    lines = [f"stage {i:>2} |{''.join(r)}|" for i, r in enumerate(rows)]
    lines.append(f"{'':9}0{'':{width - 12}}{end * 1e3:8.1f} ms")
    lines.append("digits: forward of micro-batch N; letters: its backward (a = 0, b = 1, …); blanks: bubble")
    return "\n".join(lines)


def schedule_picture(plan: Plan, model, cluster, profiles) -> str:
    """The best plan's replica-0 schedule as a markdown section (compute only, from profiles)."""
    from planner.cost.completion import complete_profiles
    from planner.cost.estimate import plan_profile_needs
    from planner.measure.profiles import ProfileKey

    kinds = {d.id: d.kind for d in cluster.devices()}
    table = complete_profiles(model, cluster, profiles, plan_profile_needs(plan), kinds=set(kinds.values()))

    def row(stage, kind, replica):
        rc = stage.recompute == "full" and kind == "block"
        key = ProfileKey(
            kinds[stage.replica_devices(replica)[0]],
            kind,
            plan.micro_batch_size,
            plan.seq_len,
            stage.tp,
            rc,
            plan.dtype,
        )
        return table.lookup(key)

    if plan.schedule == "interleaved-1f1b":
        return "_(the interleaved schedule is priced by formula; its picture is not drawn)_"
    fwd, bwd = stage_times(plan, row)
    ops = simulate(plan.schedule, fwd, bwd, plan.num_microbatches(0))
    return "\n".join(
        [
            f"## Pipeline schedule (replica 0, {plan.schedule}, {plan.num_microbatches(0)} micro-batches, compute only)",
            "```",
            gantt(ops),
            "```",
        ]
    )
