"""`pipeline_flow`: the whole job on one machine — discover → profile → plan → train.

Each stage is its own subflow passing small ids (a snapshot fingerprint, a plan fingerprint, a run
id); the data lives in DuckDB. A second run on unchanged inputs skips the costly work: discovery
reuses the stored snapshot of this hardware, profiling measures nothing it already has, the search
is a cached task — and training runs again, because that is the point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.discover import discover_flow
from flows.plan import plan_flow
from flows.profile import profile_flow
from flows.requests import TrainRequest
from flows.train import train_flow
from planner.errors import MeshplanError
from planner.specs.config import RunConfig


@flow(name="pipeline")
def pipeline_flow(db_path: str, config: RunConfig, runs_dir: str, show_progress: bool = False) -> dict[str, Any]:
    """Run every stage on this machine with `config`; returns a summary of what each stage did."""
    d, p, s, t = config.discover, config.profile, config.search, config.train
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
        f"discover: {'reused' if hw['reused'] else 'measured'} snapshot {hw['fingerprint']} "
        f"({hw['num_devices']} devices on {hw['num_nodes']} node(s))"
    )
    prof = profile_flow(
        db_path=db_path,
        model_name=config.model,
        mbs=list(p.mbs),
        seq=list(p.seq) or None,
        tp=list(p.tp),
        dtype=p.dtype,
        repeats=p.repeats,
        timeout_s=p.timeout_s,
        run_dir=str(Path(runs_dir) / "profile"),
        show_progress=show_progress,
    )
    _say(f"profile: {prof['measured']} measured, {prof['reused']} reused, {prof['estimated']} estimated")
    planned = plan_flow(
        db_path=db_path,
        model_name=config.model,
        snapshot=hw["fingerprint"],
        global_batch=s.global_batch,
        seq=s.seq,
        top_k=s.top_k,
        time_budget_s=s.time_budget_s,
        cpu_dtype=p.dtype,
    )
    if not planned.feasible:
        raise MeshplanError("model", config.model, "no plan fits this machine: " + "; ".join(planned.reasons))
    _say(
        f"plan: best {planned.best_plan_id} predicted {planned.step_time_s * 1e3:.1f} ms/step"
        f"{' (cached search)' if planned.cached else ''}"
    )
    request = TrainRequest(
        **{k: v for k, v in t.model_dump().items() if k != "nproc_per_node"},
        plan_id=planned.best_plan_id,
        nproc_per_node=planned.num_devices,
        model=config.model,
        runs_dir=runs_dir,
        show_progress=show_progress,
    )
    run = train_flow(db_path, request)
    summary = {
        "snapshot": hw,
        "profile": {k: prof[k] for k in ("measured", "reused", "estimated")},
        "plan": planned.model_dump(mode="json"),
        "run": run.model_dump(mode="json", exclude={"losses"}),
        "first_loss": run.losses[0] if run.losses else None,
        "last_loss": run.losses[-1] if run.losses else None,
    }
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


def summary_markdown(summary: dict[str, Any], db_path: str) -> str:
    hw, prof, plan, run = summary["snapshot"], summary["profile"], summary["plan"], summary["run"]
    measured, predicted = run.get("measured_step_time_s"), plan.get("step_time_s")
    err = f"{(predicted - measured) / measured:+.0%}" if measured and predicted else "n/a"
    return "\n".join(
        [
            "# meshplan run",
            "| stage | result |",
            "|---|---|",
            f"| discover | snapshot `{hw['fingerprint']}` ({'reused' if hw['reused'] else 'measured'}), {hw['num_devices']} devices |",
            f"| profile | {prof['measured']} measured, {prof['reused']} reused, {prof['estimated']} estimated |",
            f"| plan | `{plan['best_plan_id']}`{' (cached)' if plan['cached'] else ''}, predicted {predicted:.4f} s/step |",
            f"| train | run `{run['run_id']}` {run['status']}, measured {measured} s/step (prediction error {err}) |",
            f"| loss | {summary['first_loss']} → {summary['last_loss']} |",
            "",
            f"Database: `{db_path}`; run folder: `{run['run_dir']}`.",
        ]
    )
