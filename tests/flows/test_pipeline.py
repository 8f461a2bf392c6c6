"""The whole job as one Prefect flow: a second run on unchanged inputs skips discovery, profiling
and search (and says so) and trains again; a one-off profiler crash is retried and the run succeeds."""

import asyncio
import re

import pytest

from planner.specs.config import ProfileConfig, load_config

SMALL = [
    "discover.num_ranks=2",
    "discover.message_sizes=[1024, 65536]",
    "discover.repeats=2",
    "discover.matmul_size=256",
    "profile.mbs=[1, 2]",
    "profile.tp=[1]",
    "profile.repeats=2",
    "search.global_batch=4",
    "search.time_budget_s=1.0",
    "train.steps=3",
    'train.data="synthetic"',
    "train.checkpoint_every=10",
]


@pytest.mark.flow
@pytest.mark.dist
def test_second_run_skips_discovery_profiling_and_search_but_trains_again(tmp_path, capsys):
    from flows.pipeline import pipeline_flow

    cfg = load_config(None, SMALL)
    db, runs = str(tmp_path / "m.duckdb"), str(tmp_path / "runs")
    first = pipeline_flow(db, cfg, runs)
    second = pipeline_flow(db, cfg, runs, show_progress=True)  # as `meshplan run` calls it

    assert not first.snapshot.reused and first.profile.measured > 0 and not first.plan.cached
    assert second.snapshot.reused and second.snapshot.fingerprint == first.snapshot.fingerprint
    assert second.profile.measured == 0 and second.profile.reused == first.profile.measured
    assert second.plan.cached and second.plan.best_plan_id == first.plan.best_plan_id
    assert first.run.status == second.run.status == "completed"
    assert first.run.run_id != second.run.run_id  # training really ran twice
    assert second.last_loss < second.first_loss
    log = capsys.readouterr().out
    assert "discover: reused snapshot" in log and "(cached search)" in log
    progress = re.findall(r"train: steps (\d+)/(\d+) \(", log)  # the training progress lines (not a terminal)
    assert progress and progress[-1] == ("3", "3") and all(total == "3" for _, total in progress)


@pytest.mark.flow
def test_one_off_profiler_crash_is_retried_and_the_flow_succeeds(tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.profile import profile_flow

    monkeypatch.setenv("MESHPLAN_CRASH_ONCE", f"{tmp_path / 'crashes'}:profile")
    section = ProfileConfig(mbs=(1,), tp=(1,), repeats=2)
    state = profile_flow(str(tmp_path / "m.duckdb"), "tiny", section, run_dir=str(tmp_path / "prof"), return_state=True)
    assert state.is_completed()
    assert (tmp_path / "crashes" / "profile").exists()  # the first attempt really crashed
    assert state.result().measured > 0

    async def attempts() -> list[int]:
        async with get_client() as client:
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
            )
        return [r.run_count for r in runs if r.name.startswith("profile-layers")]

    assert asyncio.run(attempts()) == [2]
