"""`pipeline_flow`: the whole job on one machine — discover → profile → plan → train.

Each stage is its own subflow passing small ids (a snapshot fingerprint, a plan fingerprint, a run
id); the data lives in DuckDB. A second run on unchanged inputs skips the costly work: discovery
reuses the stored snapshot of this hardware, profiling measures nothing it already has, the search
is a cached task — and training runs again, because that is the point.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.discover import discover_flow
from flows.outcomes import PipelineOutcome
from flows.plan import plan_flow
from flows.profile import profile_flow
from flows.requests import TrainRequest, request_fields
from flows.train import train_flow
from planner.errors import MeshplanError
from planner.specs.config import RunConfig
from rundir import StateDir


@flow(name="pipeline")
def pipeline_flow(db_path: str, config: RunConfig, runs_dir: str, show_progress: bool = False) -> PipelineOutcome:
    """Run every stage on this machine with `config`; returns what each stage did.

    Each stage gets its config section whole (ProfileConfig, SearchConfig; the train section is
    TrainRequest's own fields), so a knob `meshplan profile` or `meshplan plan` honours cannot be
    dropped here (tests/flows/test_pipeline.py sets every one)."""
    d, t = config.discover, config.train
    if d.cluster:
        raise MeshplanError(
            "discover.cluster", d.cluster, "meshplan run trains on this machine; plan a cluster file with meshplan plan"
        )
    hw = discover_flow(
        db_path=db_path,
        num_ranks=d.num_ranks,
        refresh=d.refresh,
        message_sizes=list(d.message_sizes),
        repeats=d.repeats,
        matmul_size=d.matmul_size,
        timeout_s=d.timeout_s,
    )
    _say(
        f"discover: {'reused' if hw.reused else 'measured'} snapshot {hw.fingerprint} "
        f"({hw.num_devices} devices on {hw.num_nodes} node(s))"
    )
    prof = profile_flow(
        db_path=db_path,
        model_name=config.model,
        profile=config.profile,
        run_dir=str(StateDir.of_db(db_path, runs_dir).profiling()),
        show_progress=show_progress,
    )
    _say(f"profile: {prof.measured} measured, {prof.reused} reused, {prof.estimated} estimated")
    planned = plan_flow(
        db_path=db_path,
        model_name=config.model,
        search=config.search,
        snapshot=hw.fingerprint,
        cpu_dtype=config.profile.dtype,
    )
    if not planned.feasible:
        raise MeshplanError("model", config.model, "no plan fits this machine: " + "; ".join(planned.reasons))
    _say(
        f"plan: best {planned.best_plan_id} predicted {planned.step_time_s * 1e3:.1f} ms/step"
        f"{' (cached search)' if planned.cached else ''}"
    )
    request = TrainRequest(
        **request_fields(
            t,
            {"model": config.model},
            plan_id=planned.best_plan_id,
            nproc_per_node=planned.num_devices,
            runs_dir=runs_dir,
            show_progress=show_progress,
        )
    )
    run = train_flow(db_path, request)
    summary = PipelineOutcome(
        snapshot=hw,
        profile=prof,
        plan=planned,
        run=run,
        first_loss=run.losses[0] if run.losses else None,
        last_loss=run.losses[-1] if run.losses else None,
    )
    create_markdown_artifact(
        key="pipeline-summary",
        markdown=summary_markdown(summary, db_path),
        description="meshplan run: what each stage did",
    )
    return summary


def _say(message: str) -> None:
    """To the terminal (where the user watches a `meshplan run`) and to the run's log in the UI."""
    print(message, flush=True)
    get_run_logger().info(message)


def summary_markdown(summary: PipelineOutcome, db_path: str) -> str:
    hw, prof, plan, run = summary.snapshot, summary.profile, summary.plan, summary.run
    measured, predicted = run.measured_step_time_s, plan.step_time_s
    err = f"{(predicted - measured) / measured:+.0%}" if measured and predicted else "n/a"
    return "\n".join(
        [
            "# meshplan run",
            "| stage | result |",
            "|---|---|",
            f"| discover | snapshot `{hw.fingerprint}` ({'reused' if hw.reused else 'measured'}), {hw.num_devices} devices |",
            f"| profile | {prof.measured} measured, {prof.reused} reused, {prof.estimated} estimated |",
            f"| plan | `{plan.best_plan_id}`{' (cached)' if plan.cached else ''}, predicted {predicted:.4f} s/step |",
            f"| train | run `{run.run_id}` {run.status}, measured {measured} s/step (prediction error {err}) |",
            f"| loss | {summary.first_loss} → {summary.last_loss} |",
            "",
            f"Database: `{db_path}`; run folder: `{run.run_dir}`.",
        ]
    )
