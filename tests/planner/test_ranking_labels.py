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
