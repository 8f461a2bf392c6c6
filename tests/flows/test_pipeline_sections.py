"""`meshplan run` cannot drop a knob: every [profile] and [search] field set in a config file reaches the
flow that honours it, whole, and those flows read every field of their section."""

import ast
import inspect
import textwrap

import pytest

import flows.pipeline as pipeline
from flows.outcomes import DiscoverOutcome, PlanOutcome, ProfileOutcome, TrainOutcome
from flows.plan import plan_flow
from flows.profile import profile_flow
from planner.specs.config import ProfileConfig, SearchConfig, load_config

# Every field away from its default (checked below, so a new field must be added here).
CONFIG = """
model = "tiny"
[profile]
mbs = [3]
seq = [48]
tp = [4]
dtype = "bf16"
repeats = 7
timeout_s = 61
recompute = [true]
min_block_s = 0.25
retries = 5
[search]
global_batch = 24
seq = 48
top_k = 2
time_budget_s = 3.5
fp8 = true
runtime = "megatron"
"""


def test_every_section_field_set_in_the_config_reaches_its_flow(tmp_path, monkeypatch):
    cfg = load_config(CONFIG, [])  # as `meshplan --config FILE run` reads its file
    for section, default in ((cfg.profile, ProfileConfig()), (cfg.search, SearchConfig())):
        same = [f for f in type(section).model_fields if getattr(section, f) == getattr(default, f)]
        assert not same, f"set these in CONFIG too: {same}"

    seen: dict[str, dict] = {}

    def discover(**kw):
        seen["discover"] = kw
        return DiscoverOutcome(fingerprint="f", reused=True, source="probe", name="here", num_nodes=1, num_devices=2)

    def profile(**kw):
        seen["profile"] = kw
        return ProfileOutcome(
            model="tiny", fingerprint="m", device_kinds=["cpu"], local_device="cpu", torch_version="t",
            measured=0, reused=1, estimated=0, profiler_runs=0, run_dir=str(tmp_path),
        )  # fmt: skip

    def plan(**kw):
        seen["plan"] = kw
        return PlanOutcome(feasible=True, cached=True, best_plan_id="p", step_time_s=0.1, num_devices=2)

    def train(db_path, request):
        seen["train"] = request
        return TrainOutcome(
            run_id="r", run_dir=str(tmp_path), status="completed", num_telemetry_rows=0, measured_step_time_s=None,
            predicted_step_time_s=0.1, losses=[2.0, 1.0], final_plan_json="{}",
        )  # fmt: skip

    for name, fn in (
        ("discover_flow", discover),
        ("profile_flow", profile),
        ("plan_flow", plan),
        ("train_flow", train),
    ):
        monkeypatch.setattr(pipeline, name, fn)
    out = pipeline.pipeline_flow(str(tmp_path / "m.duckdb"), cfg, str(tmp_path / "runs"))
    assert seen["profile"]["profile"] == cfg.profile and seen["profile"]["model_name"] == "tiny"
    assert seen["plan"]["search"] == cfg.search and seen["plan"]["cpu_dtype"] == "bf16"
    assert seen["plan"]["snapshot"] == "f" and seen["train"].plan_id == "p" and out.last_loss == 1.0


def _reads(fn, name: str) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(fn, "fn", fn))))
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == name}


@pytest.mark.parametrize("flow, section, name", [(profile_flow, ProfileConfig, "p"), (plan_flow, SearchConfig, "s")])
def test_a_flow_reads_every_field_of_its_section(flow, section, name):
    """The flow binds its section to `name` and reads each field as `name.field`, or hands the section
    whole to the one value built from it (plan_flow: `SearchJob.of(model, inputs, s, pricing)`, which reads the
    rest as `search.field`): none left unused."""
    from tasks.searching import SearchJob

    read = _reads(flow, name)
    if flow is plan_flow:
        assert "SearchJob.of(model, inputs, s, pricing)" in inspect.getsource(plan_flow.fn)
        read |= _reads(SearchJob.of, "search")
    assert set(section.model_fields) <= read, set(section.model_fields) - read
