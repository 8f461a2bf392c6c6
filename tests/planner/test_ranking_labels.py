"""The ranking's layout label names every choice that tells two plans apart (tables show it alone)."""

from planner.report.ranking import layout
from planner.specs.plan import Plan, StagePlan


def _plan(fp8: bool = False, **stage) -> Plan:
    stages = tuple(
        StagePlan(layer_start=i, layer_end=i + 2, device_ids=(2 * i, 2 * i + 1), tp=2, **stage) for i in (0, 2)
    )
    return Plan(
        model="tiny",
        cluster="c",
        global_batch_size=4,
        seq_len=64,
        micro_batch_size=2,
        stages=stages,
        batch_shares=(4,),
        fp8=fp8,
    )


def test_layout_labels_recompute_frequency_selective_sp_and_fp8():
    assert layout(_plan()) == "pp2×dp1×tp2 mbs2 1f1b none"
    assert layout(_plan(recompute="full")).endswith(" rc2")
    assert layout(_plan(recompute="full", recompute_every=2)).endswith(" rc2/2")
    assert layout(_plan(recompute="selective")).endswith(" sel2")
    assert layout(_plan(sequence_parallel=True)).endswith(" sp")
    assert layout(_plan(fp8=True)).endswith(" fp8")
    variants = [
        _plan(),
        _plan(recompute="full"),
        _plan(recompute="full", recompute_every=2),
        _plan(recompute="selective"),
        _plan(sequence_parallel=True),
        _plan(fp8=True),
    ]
    assert len({layout(p) for p in variants}) == len(variants)  # no two rows of a ranking read the same


def _priced(tp: int, step_s: float) -> Plan:
    from planner.specs.plan import CostBreakdown

    stage = StagePlan(layer_start=0, layer_end=4, device_ids=tuple(range(tp)), tp=tp)
    plan = Plan(
        model="tiny",
        cluster="c",
        global_batch_size=4,
        seq_len=64,
        micro_batch_size=2,
        stages=(stage,),
        batch_shares=(4,),
    )
    zero = dict.fromkeys(("compute_s", "bubble_s", "pp_comm_s", "dp_comm_s", "tp_comm_s", "optimizer_s"), 0.0)
    cost = CostBreakdown(
        step_time_s=step_s,
        **zero,
        tokens_per_s=1.0,
        mfu=0.1,
        peak_memory_bytes=(1,),
        memory_capacity_bytes=(2,),
        bottleneck="compute",
    )
    return plan.model_copy(update={"predicted": cost})


def test_refused_plans_are_marked_with_the_reason():
    """A plan the runtime refuses (tp 3 on tiny's 4 heads) ranks after a slower launchable one
    (runtime.launchable_first): its row says so and why, so the out-of-order step times are explained."""
    from planner.report.ranking import ranking_rows
    from planner.runtime import launchable_first
    from planner.search.search import SearchResult, SearchStats
    from planner.specs.model import get_model

    tiny = get_model("tiny")
    ranked = launchable_first([_priced(3, 0.5), _priced(2, 0.9)], tiny)
    rows = ranking_rows(SearchResult(tuple(ranked), SearchStats()), tiny)
    assert [r["step_time_s"] for r in rows] == [0.9, 0.5]  # out of step-time order, by design
    assert [r["launchable"] for r in rows] == [True, False]
    assert rows[0]["refused"] is None and "tp" in rows[1]["refused"] and "heads" in rows[1]["refused"]
