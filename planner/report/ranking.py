"""Human-readable summaries of a search: ranked rows (for tables) and a markdown report."""

from __future__ import annotations

from planner.runtime import launch_problems
from planner.search.search import NoFeasiblePlan, SearchResult
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan

GIB = 2**30


def layout(plan: Plan, kinds: list[str] | None = None) -> str:
    tps = sorted({s.tp for s in plan.stages})
    tp = str(tps[0]) if len(tps) == 1 else "/".join(map(str, tps))
    cp = f"×cp{plan.cp}" if plan.cp > 1 else ""
    text = f"pp{plan.pp}×dp{plan.dp}{cp}×tp{tp} mbs{plan.micro_batch_size} {plan.schedule} {plan.stages[0].sharding}"
    if any(s.recompute == "full" for s in plan.stages):
        text += f" rc{sum(s.recompute == 'full' for s in plan.stages)}"
        k = max(s.recompute_every for s in plan.stages)
        text += f"/{k}" if k > 1 else ""  # every k-th block of those stages
    if any(s.recompute == "selective" for s in plan.stages):
        text += f" sel{sum(s.recompute == 'selective' for s in plan.stages)}"
    if any(s.sequence_parallel for s in plan.stages):
        text += " sp"
    if plan.fp8:
        text += " fp8"
    return text


def plan_row(plan: Plan, rank: int | str, speedups: dict[str, float | None]) -> dict:
    """One ranked plan as numbers with units in their names (tables format them, --json prints them)."""
    c = plan.predicted
    assert c is not None
    worst = max(
        range(len(c.peak_memory_bytes)), key=lambda j: c.peak_memory_bytes[j] / max(1, c.memory_capacity_bytes[j])
    )
    row = {
        "rank": rank,
        "layout": layout(plan),
        "step_time_s": round(c.step_time_s, 6),
        "tokens_per_s": round(c.tokens_per_s, 1),
        "mfu": round(c.mfu, 4),
        # the stage closest to its memory limit; numbers, so --json readers need not parse "12.3/40 GiB"
        "peak_memory_bytes": c.peak_memory_bytes[worst],
        "memory_capacity_bytes": c.memory_capacity_bytes[worst],
        "bottleneck": c.bottleneck,
        "devices": plan.num_devices,
        "fingerprint": plan.fingerprint(),
    }
    for name, v in speedups.items():
        row[f"vs_{name}"] = None if v is None else round(v, 3)
    return row


def ranking_rows(result: SearchResult, model: ModelSpec | None = None) -> list[dict]:
    """The ranked plans, then the baselines. Plans the runtime can launch come first
    (planner/runtime.launchable_first), so a refused plan may be faster than the ones above it:
    its row says `launchable: false` and why (`refused`), and the table marks it, so step times
    that go down the table are explained, never silently out of order."""
    rows = []
    for i, p in enumerate(result.plans):
        ups = {}
        for name, b in result.baselines.items():
            ok = b is not None and b.predicted is not None and b.predicted.feasible
            ups[name] = b.predicted.step_time_s / p.predicted.step_time_s if ok else None  # type: ignore[union-attr]
        row = plan_row(p, i + 1, ups)
        problems = launch_problems(p, model=model)
        row["launchable"] = not problems
        row["refused"] = f"{problems[0].field}: {problems[0].fix}" if problems else None
        rows.append(row)
    for name, b in result.baselines.items():
        if b is not None and b.predicted is not None:
            rows.append(plan_row(b, f"baseline:{name}", {}))
    return rows


def markdown_report(result: SearchResult | NoFeasiblePlan, title: str) -> str:
    if isinstance(result, NoFeasiblePlan):
        return f"# {title}\n\n**No feasible plan.**\n\n" + "\n".join(f"- {r}" for r in result.reasons) + "\n"
    best = result.best
    c = best.predicted
    assert c is not None
    lines = [
        f"# {title}",
        "",
        f"**Best plan** `{best.fingerprint()}`: {layout(best)} on {best.num_devices} devices — "
        f"{c.step_time_s:.4g} s/step, {c.tokens_per_s:,.0f} tokens/s, MFU {c.mfu:.1%}.",
        "",
        f"**Bottleneck:** {c.bottleneck}.",
        "",
        "| term | seconds |",
        "|---|---|",
        *(
            f"| {k} | {v:.4g} |"
            for k, v in (
                ("compute", c.compute_s),
                ("pipeline bubble", c.bubble_s),
                ("pipeline p2p", c.pp_comm_s),
                ("tensor-parallel", c.tp_comm_s),
                ("data-parallel", c.dp_comm_s),
                ("optimizer", c.optimizer_s),
            )
        ),
        "",
        "| stage | layers | tp | devices | recompute | peak memory | capacity |",
        "|---|---|---|---|---|---|---|",
    ]
    for j, s in enumerate(best.stages[: best.pp]):
        lines.append(
            f"| {j} | {s.layer_start}–{s.layer_end - 1} | {s.tp} | {len(s.device_ids)} | {s.recompute} | "
            f"{c.peak_memory_bytes[j] / GIB:.1f} GiB | {c.memory_capacity_bytes[j] / GIB:.0f} GiB |"
        )
    lines += [
        "",
        "Speed-up over baselines: "
        + ", ".join(f"{n} {result.speedup(n):.2f}×" if result.speedup(n) else f"{n} n/a" for n in result.baselines),
    ]
    s = result.stats
    lines += [
        f"Search: {s.shapes} shapes, {s.candidates} candidates, {s.pruned} pruned, {s.wall_s:.2f} s; " + s.summary()
    ]
    return "\n".join(lines) + "\n"
