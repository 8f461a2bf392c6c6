"""The flows' typed contracts without a flow run: TrainRequest validates, outcomes survive Prefect's serialisers.

(Real flow runs that take a TrainRequest and return outcomes: tests/flows/test_train_flow.py,
test_plan_flow.py, test_replan_flow.py.)"""

from __future__ import annotations

import pytest
from prefect.serializers import JSONSerializer, PickleSerializer
from prefect.utilities.callables import parameter_schema

from flows.outcomes import (
    DiscoverOutcome,
    DryRunOutcome,
    DryRunStage,
    JobOutcome,
    JobSegment,
    KindEfficiency,
    PipelineOutcome,
    PlanOutcome,
    ProfileOutcome,
    ReplanOutcome,
    SchedulerOutcome,
    ServeOutcome,
    TrainOutcome,
)
from flows.plan import plan_flow
from flows.profile import profile_flow
from flows.requests import TrainRequest, request_fields
from flows.train import train_flow
from planner.errors import MeshplanError
from planner.specs.config import ProfileConfig, ReplanConfig, SearchConfig, TrainConfig
from planner.specs.faults import FaultSpec
from planner.specs.runspec import RunSpec
from planner.validation import parse


def test_a_misspelt_or_bad_option_is_a_meshplan_error_naming_it():
    with pytest.raises(MeshplanError) as exc:
        parse(TrainRequest, {"plan_path": "p.json", "spec": {"stpes": 3}}, "train")
    assert exc.value.field == "train: spec.stpes"
    with pytest.raises(MeshplanError) as exc:
        parse(TrainRequest, {"plan_path": "p.json", "spec": {"faults": {"slow_rank": 1, "slow_factor": 0.5}}}, "train")
    assert exc.value.field == "train: spec.faults.slow_factor"


def test_the_cli_can_pass_its_whole_train_section():
    """`meshplan train` and the pipeline spread RunConfig.train into the request: every field must exist."""
    fields = request_fields(TrainConfig(lr=0.5), plan_path="p.json", replan_config={"threshold": 0.3})
    req = TrainRequest(**fields)
    assert req.replan_config == ReplanConfig(threshold=0.3) and req.spec.steps == TrainConfig().steps
    assert req.spec.lr == 0.5 and req.timeout_s == TrainConfig().timeout_s


def test_train_flow_takes_ids_and_one_request_and_prefect_can_describe_it():
    schema = parameter_schema(train_flow.fn)
    assert list(schema.properties) == ["db_path", "request", "run_id"]
    assert schema.required == ["db_path", "request"]


def test_profile_and_plan_flows_take_their_config_section_whole():
    for flow, section, name in ((profile_flow, ProfileConfig, "profile"), (plan_flow, SearchConfig, "search")):
        schema = parameter_schema(flow.fn)
        assert list(schema.properties)[:3] == ["db_path", "model_name", name]
        assert not set(section.model_fields) & set(schema.properties)  # no field of it passed on its own


_DISCOVERED = DiscoverOutcome(fingerprint="f", reused=False, source="probe", name="n", num_nodes=1, num_devices=2)
_PROFILED = ProfileOutcome(
    model="tiny",
    fingerprint="m",
    device_kinds=["cpu", "T4"],
    local_device="cpu",
    torch_version="2.13",
    measured=6,
    reused=0,
    estimated=3,
    profiler_runs=1,
    efficiency={"T4": KindEfficiency(efficiency=0.55, source="default")},
    comm_fits=[{"op": "all_reduce", "alpha_s": 1e-5}],
    run_dir="/tmp/p",
    optimizer={"plain": 1e-9, "num_ranks": 2},
    optimizer_measured=1,
)
_TRAINED = TrainOutcome(
    run_id="r",
    run_dir="/tmp/r",
    status="completed",
    num_telemetry_rows=8,
    measured_step_time_s=0.01,
    predicted_step_time_s=None,
    losses=[2.0, None],
    decisions=[{"step": 3, "chosen_action": "rebalance", "detections": [{"rank": 1}]}],
    final_plan_json="{}",
)


@pytest.mark.parametrize("serializer", [JSONSerializer(), PickleSerializer()])
def test_requests_and_outcomes_survive_prefects_serialisers(serializer):
    values = [
        _DISCOVERED,
        _PROFILED,
        DryRunOutcome(
            ok=True,
            plan="f",
            world_size=2,
            schedule="1f1b",
            num_microbatches=[2],
            stages=[DryRunStage(stage=0, layers=[0, 4], tp=1, dp=1, ranks=[0], device_ids=[0])],
            steps=2,
            steps_done=2,
            losses=[2.1, 2.0],
            model={"name": "tiny"},
            problems=[],
            lines=["ok"],
            run_id="d",
            run_dir="/tmp/d",
            wall_s=3.5,
        ),
        PipelineOutcome(
            snapshot=_DISCOVERED,
            profile=_PROFILED,
            plan=PlanOutcome(feasible=True, cached=False, best_plan_id="p", step_time_s=0.1),
            run=_TRAINED,
            first_loss=2.0,
            last_loss=1.5,
        ),
        TrainRequest(plan_id="abc", spec=RunSpec(faults=FaultSpec(kill_rank=1, kill_step=2)), replan=True),
        _TRAINED,
        PlanOutcome(feasible=False, cached=True, reasons=["too big"]),
        ServeOutcome(
            run_id="s",
            run_dir="/tmp/s",
            recorded=3,
            statuses=[200, 503],
            calibration={"('a', 1, 1, 1)": (0.01,)},
            group_events=[{"group": 0, "generation": 0, "event": "died", "at_s": 1.5, "returncode": -9}],
        ),
        ReplanOutcome(run_id="r", detected=True, action="keep", reason="x", acted=False, decision_id=4),
        JobOutcome(
            job_id="a",
            state="finished",
            run_dir="/tmp/a",
            segments=[JobSegment(allocation="4xcpu/1", plan_fingerprint="f", from_step=0, to_step=5, exit="done")],
        ),
        SchedulerOutcome(
            actions=[("a", "start", "4xcpu/1")],
            rejections=[("b", "too big")],
            waiting=[],
            applied=[{"job_id": "a", "action": "start", "runner_pid": 7}],
            requeued=[],
        ),
    ]
    for v in values:
        back = serializer.loads(serializer.dumps(v))
        assert type(back) is type(v) and back == v  # Prefect's JSON keeps the pydantic type
