"""Stage 3 flow: load model, cluster and profiles; search; store ranked plans; attach artifacts.

`plan_flow` is the Prefect face of `planner.search.search`: the search is a cached task, plans go
to DuckDB (upsert), and the UI gets a table artifact (ranked plans vs baselines) and a markdown
artifact (best plan's bottleneck and memory per stage).
"""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.outcomes import PlanOutcome
from flows.queries import runtime_pricing
from launcher.progress import say, working
from planner.report.ranking import markdown_report, ranking_rows
from planner.report.timeline import schedule_picture
from planner.search import NoFeasiblePlan
from planner.specs.config import ProfileConfig, SearchConfig
from planner.specs.model import get_model
from tasks.plan import prepare_search, search_plans, store_plans
from tasks.searching import SearchJob


@flow(name="plan", log_prints=True)
def plan_flow(
    db_path: str,
    model_name: str,
    search: SearchConfig | None = None,
    cluster_file: str | None = None,
    snapshot: str | None = None,
    cpu_dtype: str = ProfileConfig().dtype,
) -> PlanOutcome:
    """Search plans for `model_name` on a cluster file, or on a discovered snapshot (default: the
    newest probe of this machine); returns the stored search's PlanOutcome (flows/outcomes.py).

    `search` is the config's [search] section, taken whole (None: its defaults), so no knob of it is
    lost on the way. Cluster, profiles, calibration and dtype come from storage.pricing.pricing_inputs,
    as for `meshplan plan` without --flow: plans train in bf16 on GPUs and in `cpu_dtype` (the config's
    profile.dtype) on CPU ranks, and a discovered CPU machine is priced with its measured corrections.
    The search prices under `search.runtime` with the figures stored for it (flows.queries.runtime_pricing,
    planner.cost.runtimes.Pricing), as `meshplan plan --runtime` does."""
    s = search or SearchConfig()
    model = get_model(model_name)
    inputs = prepare_search(db_path, model, cluster_file, snapshot, cpu_dtype)
    cluster, profiles = inputs.cluster, inputs.profiles
    pricing = runtime_pricing(db_path, cluster, s.runtime)
    say(f"plan: priced for runtime {pricing.label(cluster.nodes[0].device_kind)}")
    if inputs.calibration is not None:
        say(f"plan: calibrated to {inputs.calibration.source}")
    with working(f"plan: searching {model.name} on {cluster.name} ({cluster.num_devices} devices)…"):
        searched = search_plans(SearchJob.of(model, inputs, s, pricing), return_state=True)
    result, cached = searched.result(), searched.name == "Cached"
    if cached:
        say("plan: search result reused from the cache (same model, cluster, profiles and options)")
    else:
        st = result.stats
        say(
            f"plan: {st.candidates} candidates priced ({st.pruned} pruned, {st.infeasible} infeasible) "
            f"in {st.wall_s:.2f} s; {st.summary()}"
        )
    title = f"{model.name} on {cluster.name} (batch {s.global_batch})"
    report = markdown_report(result, title)
    if not isinstance(result, NoFeasiblePlan):
        report += "\n\n" + schedule_picture(result.best, model, cluster, profiles)
    create_markdown_artifact(key="plan-report", markdown=report, description=title)
    if isinstance(result, NoFeasiblePlan):
        return PlanOutcome(feasible=False, reasons=list(result.reasons), cached=cached)
    key = store_plans(db_path, result)
    create_table_artifact(key="plan-ranking", table=ranking_rows(result, model), description=title)
    return PlanOutcome(
        feasible=True,
        cached=cached,
        search_key=key,
        best_plan_id=result.best.fingerprint(),
        step_time_s=result.best.predicted.step_time_s,
        num_devices=result.best.num_devices,
        num_candidates=result.stats.candidates,
        complete=result.stats.complete,
        gap_fraction=result.stats.gap_fraction,
    )
