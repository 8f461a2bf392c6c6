"""plan_flow as a real Prefect flow run: plans stored in DuckDB, artifacts attached, cache reused."""

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples" / "clusters"

pytestmark = pytest.mark.flow


def _artifacts(key, flow_run_id):
    """The `key` artifacts of this flow run only: other tests' plan flows publish the same keys."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))  # fmt: skip

    return asyncio.run(read())


def test_plan_flow_stores_ranked_plans_and_attaches_artifacts(tmp_path, capsys):
    from flows.plan import plan_flow
    from storage.plans import best_plan, plans_frame

    db = str(tmp_path / "m.duckdb")
    state = plan_flow(db, "gpt2-small", str(EXAMPLES / "mixed-a100-v100-t4.toml"), global_batch=32, top_k=3,
                      time_budget_s=5.0, return_state=True)  # fmt: skip
    out = state.result()
    assert out["feasible"]
    frame = plans_frame(db, out["search_key"])
    assert frame.filter(frame["baseline"] == "").height >= 1
    assert best_plan(db, out["search_key"]).fingerprint() == out["best"]
    run_id = state.state_details.flow_run_id
    assert len(_artifacts("plan-ranking", run_id)) == 1 and len(_artifacts("plan-report", run_id)) == 1
    shown = capsys.readouterr().out  # the search's progress lines (plain: pytest's stdout is no terminal)
    assert "plan: searching gpt2-small on" in shown and f"plan: {out['candidates']} candidates priced" in shown
    again = plan_flow(db, "gpt2-small", str(EXAMPLES / "mixed-a100-v100-t4.toml"), global_batch=32, top_k=3,
                      time_budget_s=5.0)  # fmt: skip
    assert again["best"] == out["best"]
    assert "search result reused from the cache" in capsys.readouterr().out
    assert plans_frame(db, out["search_key"]).height == frame.height


def test_plan_flow_reports_an_infeasible_model(tmp_path):
    from flows.plan import plan_flow

    out = plan_flow(str(tmp_path / "m.duckdb"), "gpt3-175b", str(EXAMPLES / "mixed-a100-v100-t4.toml"), global_batch=8)
    assert not out["feasible"] and "gpt3-175b needs" in out["reasons"][0]
