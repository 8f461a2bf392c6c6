"""Stage 3 flow: load model, cluster and profiles; search; store ranked plans; attach artifacts.

`plan_flow` is the Prefect face of `planner.search.search`: the search is a cached task, plans go
to DuckDB (upsert), and the UI gets a table artifact (ranked plans vs baselines) and a markdown
artifact (best plan's bottleneck and memory per stage).
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from launcher.progress import say, working
from planner.measure.targets import is_gpu
from planner.report.ranking import markdown_report, ranking_rows
from planner.report.timeline import schedule_picture
from planner.search import NoFeasiblePlan
from planner.specs.model import get_model
from storage.files import read_cluster_file
from storage.hardware import resolve_cluster
from tasks.plan import load_calibration, load_profiles, search_plans, store_plans


@flow(name="plan", log_prints=True)
def plan_flow(
    db_path: str,
    model_name: str,
    cluster_file: str | None = None,
    global_batch: int = 8,
    seq: int = 0,
    top_k: int = 5,
    time_budget_s: float = 10.0,
    snapshot: str | None = None,
    cpu_dtype: str = "fp32",
) -> dict[str, Any]:
    """Search plans for `model_name` on a cluster file, or on a discovered snapshot (default: the
    newest probe of this machine); returns {feasible, search_key, best, reasons, step_time_s}.

    Plans train in bf16 on GPUs and in `cpu_dtype` on a cluster of CPU ranks: the dtype the profile
    stage measures there and worker.train runs there (planner.measure.targets.device_dtype)."""
    model = get_model(model_name)
    cluster = read_cluster_file(cluster_file) if cluster_file else resolve_cluster(db_path, snapshot)
    dtype = "bf16" if any(is_gpu(k) for k in cluster.device_kinds()) else cpu_dtype
    profiles = load_profiles(db_path, model)
    # a discovered CPU machine is priced with what discovery and profiling measured (planner.measure.calibrate)
    calibration = None if cluster_file else load_calibration(db_path, model, snapshot)
    if calibration is not None:
        say(f"plan: calibrated to {calibration.source}")
    with working(f"plan: searching {model.name} on {cluster.name} ({cluster.num_devices} devices)…"):
        searched = search_plans(
            model,
            cluster,
            profiles,
            global_batch,
            seq or model.seq_len,
            top_k,
            time_budget_s,
            calibration,
            dtype,
            return_state=True,
        )
    result, cached = searched.result(), searched.name == "Cached"
    if cached:
        say("plan: search result reused from the cache (same model, cluster, profiles and options)")
    else:
        st = result.stats
        say(
            f"plan: {st.candidates} candidates priced ({st.pruned} pruned, {st.infeasible} infeasible) "
            f"in {st.wall_s:.2f} s{' (time budget hit)' if st.timed_out else ''}"
        )
    title = f"{model.name} on {cluster.name} (batch {global_batch})"
    report = markdown_report(result, title)
    if not isinstance(result, NoFeasiblePlan):
        report += "\n\n" + schedule_picture(result.best, model, cluster, profiles)
    create_markdown_artifact(key="plan-report", markdown=report, description=title)
    if isinstance(result, NoFeasiblePlan):
        return {"feasible": False, "reasons": list(result.reasons), "search_key": None, "best": None, "cached": cached}
    key = store_plans(db_path, result)
    create_table_artifact(key="plan-ranking", table=ranking_rows(result), description=title)
    return {
        "feasible": True,
        "search_key": key,
        "best": result.best.fingerprint(),
        "reasons": [],
        "step_time_s": result.best.predicted.step_time_s,
        "cached": cached,
        "num_devices": result.best.num_devices,
        "candidates": result.stats.candidates,
    }
