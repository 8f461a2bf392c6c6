"""Plans export to torchtitan TOML and Megatron-LM arguments, naming what the format cannot hold."""

import tomllib

from planner.report.export import to_megatron, to_torchtitan
from planner.specs.model import get_model
from planner.specs.plan import Plan, StagePlan


def _plan(shares=(4, 4), sizes=(1, 3), recompute="none", sharding="none") -> Plan:
    stages, start = [], 0
    for i, n in enumerate(sizes):
        stages.append(
            StagePlan(
                layer_start=start,
                layer_end=start + n,
                device_ids=(2 * i, 2 * i + 1),
                dp=2,
                recompute=recompute,
                sharding=sharding,
            )
        )
        start += n
    return Plan(
        model="tiny",
        cluster="c",
        global_batch_size=sum(shares),
        seq_len=64,
        micro_batch_size=2,
        stages=tuple(stages),
        batch_shares=shares,
    )


def test_torchtitan_export_is_valid_toml_with_split_points():
    text, warnings = to_torchtitan(_plan(sharding="zero3"))
    cfg = tomllib.loads(text)
    p = cfg["parallelism"]
    assert p["pipeline_parallel_degree"] == 2 and p["pipeline_parallel_split_points"] == ["layers.1"]
    assert p["data_parallel_shard_degree"] == 2 and p["fsdp_reshard_after_forward"] == "always"
    assert cfg["training"]["global_batch_size"] == 8 and cfg["training"]["local_batch_size"] == 4
    assert warnings == []


def test_unequal_shares_are_reported_not_dropped():
    _, warnings = to_torchtitan(_plan(shares=(6, 2)))
    assert any("unequal batch shares [6, 2]" in w for w in warnings)


def test_megatron_args_carry_uneven_first_last_stage_and_gqa():
    text, warnings = to_megatron(_plan(sizes=(1, 3), recompute="full"), get_model("tiny-llama"))
    assert "--pipeline-model-parallel-size 2" in text
    assert "--decoder-first-pipeline-num-layers 1" in text and "--decoder-last-pipeline-num-layers 3" in text
    assert "--num-query-groups 2" in text and "--recompute-granularity full" in text
    assert warnings == []


def test_megatron_reports_uneven_middle_stages():
    bounds = [(0, 2), (2, 5), (5, 9), (9, 12)]
    plan = Plan(
        model="gpt2-small",
        cluster="c",
        global_batch_size=2,
        seq_len=1024,
        micro_batch_size=1,
        stages=tuple(StagePlan(layer_start=a, layer_end=b, device_ids=(i,)) for i, (a, b) in enumerate(bounds)),
        batch_shares=(2,),
    )
    _, warnings = to_megatron(plan, get_model("gpt2-small"))
    assert any("uneven middle stages [2, 3, 4, 3]" in w for w in warnings)


def test_megatron_export_turns_on_the_overlap_megatron_runtime_prices():
    text, _ = to_megatron(_plan(sharding="zero1"), get_model("tiny"))
    assert "--overlap-grad-reduce" in text and "--overlap-param-gather" in text
