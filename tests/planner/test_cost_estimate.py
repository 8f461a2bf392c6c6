"""estimate(): a known plan priced term by term; the golden plan; user errors on plans that don't fit."""

from pathlib import Path

import pytest

from planner.cost import estimate
from planner.cost import formulas as F
from planner.errors import MeshplanError
from planner.specs.cluster import parse_cluster
from planner.specs.flops import block_input_bytes
from planner.specs.model import get_model
from planner.specs.plan import Plan, StagePlan, parse_plan_json

GOLDEN = Path(__file__).parents[1] / "data" / "plan_v1.json"


def t4_cluster():
    return parse_cluster(
        {
            "name": "golden-4xT4",
            "nodes": [
                {
                    "name": "t4",
                    "device": "T4",
                    "num_devices": 2,
                    "count": 2,
                    "intra_link": "pcie3",
                    "inter_link": "eth-100g",
                }
            ],
        }
    )


def test_golden_plan_keeps_loading_validating_and_pricing():
    plan = parse_plan_json(GOLDEN.read_text())
    assert plan.version == 1 and plan.pp == 2 and plan.dp == 2
    assert [s.num_layers for s in plan.stages] == [1, 3]
    assert parse_plan_json(plan.to_json()) == plan
    cost = estimate(plan, get_model("tiny"), t4_cluster())
    assert cost.feasible and cost.step_time_s > 0
    assert len(cost.peak_memory_bytes) == 2


def test_breakdown_adds_up_to_step_time():
    plan = parse_plan_json(GOLDEN.read_text())
    c = estimate(plan, get_model("tiny"), t4_cluster())
    parts = c.compute_s + c.bubble_s + c.pp_comm_s + c.tp_comm_s + c.dp_comm_s + c.optimizer_s
    assert parts == pytest.approx(c.step_time_s, rel=1e-9)


def test_p2p_between_nodes_is_priced_on_the_slower_hop():
    # stage 0 sits on node 0 and stage 1 on node 1: eth-100g (12.5 GB/s, 20 µs) is narrower than PCIe 3
    plan = parse_plan_json(GOLDEN.read_text())
    model = get_model("tiny")
    per_mb = 2 * F.p2p_s(block_input_bytes(model, 2, 64), 12.5e9, 20e-6)
    c = estimate(plan, model, t4_cluster())
    assert c.pp_comm_s in (0.0, pytest.approx(plan.num_microbatches() * per_mb))


def test_single_device_memory_matches_hand_count():
    model = get_model("tiny")
    plan = Plan(
        model="tiny",
        cluster="c",
        global_batch_size=2,
        seq_len=64,
        micro_batch_size=2,
        stages=(StagePlan(layer_start=0, layer_end=4, device_ids=(0,)),),
        batch_shares=(2,),
    )
    c = estimate(plan, model, t4_cluster())
    params = model.num_params()  # tied GPT on one stage: every parameter once
    from planner.measure.profiles import ProfileKey, estimate_layer

    spec = t4_cluster().nodes[0]

    def row(kind):
        return estimate_layer(
            model,
            ProfileKey("T4", kind, 2, 64, 1, False, "bf16"),
            spec.peak_flop_per_s(),
            spec.memory_bandwidth_bytes_per_s,
        )

    acts = 4 * row("block").activation_bytes + row("embedding").activation_bytes + row("head").activation_bytes
    work = max(row(k).workspace_bytes for k in ("block", "embedding", "head"))
    expected = (params * 16 + acts + work) * 1.10 + F.RUNTIME_RESERVE_BYTES_GPU
    assert c.peak_memory_bytes[0] == pytest.approx(expected, rel=1e-6)
    assert c.dp_comm_s == 0 and c.pp_comm_s == 0 and c.bubble_s == 0


def test_estimate_names_the_field_of_a_plan_that_does_not_fit_the_model():
    plan = parse_plan_json(GOLDEN.read_text())
    with pytest.raises(MeshplanError) as e:
        estimate(plan, get_model("gpt2-small"), t4_cluster())
    assert "stages[-1].layer_end" in str(e.value)


def test_estimate_rejects_device_ids_outside_the_cluster():
    data = parse_plan_json(GOLDEN.read_text()).model_dump(mode="json")
    data["stages"][1]["device_ids"] = [2, 9]
    plan = Plan.model_validate(data)
    with pytest.raises(MeshplanError) as e:
        estimate(plan, get_model("tiny"), t4_cluster())
    assert "device_ids" in e.value.field


def test_plan_too_big_for_memory_is_reported_infeasible_with_numbers():
    model = get_model("gpt3-6.7b")
    plan = Plan(
        model=model.name,
        cluster="c",
        global_batch_size=4,
        seq_len=2048,
        micro_batch_size=1,
        stages=(StagePlan(layer_start=0, layer_end=32, device_ids=(0,)),),
        batch_shares=(4,),
    )
    c = estimate(plan, model, t4_cluster())
    assert not c.feasible
    assert c.bottleneck.startswith("memory (stage 0:") and "GiB" in c.bottleneck


def test_interleaved_schedule_has_a_smaller_bubble_than_1f1b():
    model = get_model("gpt3-1.3b")
    cl = parse_cluster(
        {
            "name": "a",
            "nodes": [
                {
                    "name": "a",
                    "device": "A100-SXM4-80GB",
                    "num_devices": 4,
                    "intra_link": "nvlink3",
                    "inter_link": "ib-hdr",
                }
            ],
        }
    )
    common = dict(
        model=model.name, cluster="a", global_batch_size=16, seq_len=2048, micro_batch_size=1, batch_shares=(16,)
    )
    plain = Plan(
        schedule="1f1b",
        stages=tuple(StagePlan(layer_start=6 * i, layer_end=6 * i + 6, device_ids=(i,)) for i in range(4)),
        **common,
    )
    inter = Plan(
        schedule="interleaved-1f1b",
        virtual_stages=2,
        stages=tuple(StagePlan(layer_start=3 * i, layer_end=3 * i + 3, device_ids=(i % 4,)) for i in range(8)),
        **common,
    )
    a, b = estimate(plain, model, cl), estimate(inter, model, cl)
    assert b.bubble_s < a.bubble_s
    assert b.bubble_s == pytest.approx(a.bubble_s / 2, rel=0.05)
