"""The dry run's scaled model (planner/specs/dryrun.py) and its telemetry check (planner/report/dryrun.py)."""

import pytest

from planner.report.dryrun import dry_run_report
from planner.runtime import launch_problems, rank_map
from planner.specs.dryrun import DRY_SEQ, dry_run_model, dry_run_plan
from planner.specs.model import get_model
from planner.specs.plan import parse_plan


def plan_for(model: str, stages: list[dict], gb: int = 8, mbs: int = 1, dp: int = 1, schedule: str = "1f1b"):
    return parse_plan(
        {
            "model": model,
            "cluster": "c",
            "global_batch_size": gb,
            "seq_len": 2048,
            "micro_batch_size": mbs,
            "schedule": schedule,
            "stages": stages,
            "batch_shares": [gb // dp] * dp,
        }
    )


# devices out of pipeline order, as the search places a mixed cluster's kinds
TWO_STAGES = [
    {"layer_start": 0, "layer_end": 10, "device_ids": [3, 1], "tp": 2},
    {"layer_start": 10, "layer_end": 32, "device_ids": [0, 2], "tp": 2},
]


@pytest.mark.parametrize("name", ["gpt3-6.7b", "llama3-8b"])
def test_the_dry_model_keeps_layers_family_and_head_divisibility_and_is_tiny(name):
    real = get_model(name)
    plan = plan_for(name, TWO_STAGES)
    tiny = dry_run_model(real, plan)
    assert (tiny.num_layers, tiny.family) == (real.num_layers, real.family)
    assert (tiny.kv_heads < tiny.num_heads) == (real.kv_heads < real.num_heads)  # grouped-query kept
    assert tiny.hidden <= 128 and tiny.vocab_size <= 256 and tiny.seq_len == DRY_SEQ
    assert tiny.num_params() < 2_000_000 < real.num_params() / 1000
    dry = dry_run_plan(plan, tiny)
    # the layout is the plan's: only the sequence length and the prediction differ
    assert dry.stages == plan.stages and dry.batch_shares == plan.batch_shares and dry.schedule == plan.schedule
    assert rank_map(dry) == rank_map(plan)
    assert launch_problems(dry, dry.num_devices, tiny) == launch_problems(plan, plan.num_devices, real) == ()


def test_every_stage_tp_divides_the_dry_heads():
    """tp 4 on one stage and 2 on another (what S1's runtime launches): heads and kv heads are multiples of 4."""
    stages = [
        {"layer_start": 0, "layer_end": 16, "device_ids": [0, 1, 2, 3], "tp": 4},
        {"layer_start": 16, "layer_end": 32, "device_ids": [4, 5], "tp": 2},
    ]
    tiny = dry_run_model(get_model("llama3-8b"), plan_for("llama3-8b", stages))
    assert tiny.num_heads % 4 == 0 and tiny.kv_heads % 4 == 0 and tiny.ffn % 4 == 0
    assert [p for p in launch_problems(plan_for("llama3-8b", stages), model=tiny) if "heads" in p.fix] == []


def rows_for(plan, steps):
    return [
        {"rank": s.rank, "step": k, "stage": s.stage, "replica": s.replica, "tp_index": s.tp_index, "loss": 1.0}
        for k in range(steps)
        for s in rank_map(plan)
    ]


def test_the_report_passes_a_complete_run_and_names_what_is_missing_or_misplaced():
    plan = plan_for("gpt3-6.7b", TWO_STAGES)
    tiny = dry_run_model(get_model("gpt3-6.7b"), plan)
    ok = dry_run_report(plan, tiny, rows_for(plan, 2), 2, [5.5, 5.4])
    assert ok.ok and ok.steps_done == 2 and ok.world_size == 4
    assert [s.device_ids for s in ok.stages] == [(3, 1), (0, 2)] and [s.ranks for s in ok.stages] == [(0, 1), (2, 3)]
    assert "stage 1: layers 10-31, tp2×dp1, ranks [2, 3] = plan devices [0, 2]" in ok.lines()

    short = [r for r in rows_for(plan, 2) if not (r["step"] == 1 and r["rank"] == 3)]
    bad = dry_run_report(plan, tiny, short, 2)
    assert not bad.ok and bad.steps_done == 1 and bad.problems == ("step 1 was not reported by ranks [3] (of 4)",)

    swapped = [{**r, "stage": 1 - r["stage"]} if r["rank"] == 0 else r for r in rows_for(plan, 2)]
    wrong = dry_run_report(plan, tiny, swapped, 2)
    assert not wrong.ok and "rank 0 ran stage 1" in wrong.problems[0]

    nan = [{**r, "loss": float("nan")} if r["rank"] == 2 else r for r in rows_for(plan, 1)]
    assert "rank 2 logged loss nan" in dry_run_report(plan, tiny, nan, 1).problems[0]
