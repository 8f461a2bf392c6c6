"""The flows' typed contracts without a flow run: TrainRequest validates, outcomes survive Prefect's serialisers.

(Real flow runs that take a TrainRequest and return outcomes: tests/flows/test_train_flow.py,
test_plan_flow.py, test_replan_flow.py.)"""

from __future__ import annotations

import pytest
from prefect.serializers import JSONSerializer, PickleSerializer
from prefect.utilities.callables import parameter_schema

from flows.outcomes import JobOutcome, JobSegment, PlanOutcome, ReplanOutcome, SchedulerOutcome, TrainOutcome
from flows.requests import TrainRequest
from flows.train import train_flow
from planner.errors import MeshplanError
from planner.specs.config import ReplanConfig, TrainConfig
from planner.specs.faults import FaultSpec
from planner.validation import parse


def test_a_misspelt_or_bad_option_is_a_meshplan_error_naming_it():
    with pytest.raises(MeshplanError) as exc:
        parse(TrainRequest, {"plan_path": "p.json", "stpes": 3}, "train")
    assert exc.value.field == "train: stpes"
    with pytest.raises(MeshplanError) as exc:
        parse(TrainRequest, {"plan_path": "p.json", "faults": {"slow_rank": 1, "slow_factor": 0.5}}, "train")
    assert exc.value.field == "train: faults.slow_factor"


def test_the_cli_can_pass_its_whole_train_section():
    """`meshplan train` and the pipeline spread RunConfig.train into the request: every field must exist."""
    assert set(TrainConfig.model_fields) <= set(TrainRequest.model_fields)
    req = TrainRequest(**TrainConfig().model_dump(), plan_path="p.json", replan_config={"threshold": 0.3})
    assert req.replan_config == ReplanConfig(threshold=0.3) and req.steps == TrainConfig().steps


def test_train_flow_takes_ids_and_one_request_and_prefect_can_describe_it():
    schema = parameter_schema(train_flow.fn)
    assert list(schema.properties) == ["db_path", "request", "run_id"]
    assert schema.required == ["db_path", "request"]


@pytest.mark.parametrize("serializer", [JSONSerializer(), PickleSerializer()])
def test_requests_and_outcomes_survive_prefects_serialisers(serializer):
    values = [
        TrainRequest(plan_id="abc", faults=FaultSpec(kill_rank=1, kill_step=2), replan=True),
        TrainOutcome(
            run_id="r",
            run_dir="/tmp/r",
            status="completed",
            num_telemetry_rows=8,
            measured_step_time_s=0.01,
            predicted_step_time_s=None,
            losses=[2.0, None],
            decisions=[{"step": 3, "chosen_action": "rebalance", "detections": [{"rank": 1}]}],
            final_plan_json="{}",
        ),
        PlanOutcome(feasible=False, cached=True, reasons=["too big"]),
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
