"""What the flows return: typed outcomes, not `dict[str, Any]`.

One frozen pydantic model per flow, fields named with their units (`_s`, `num_`, `_id`, `_json`).
Prefect persists and shows them as it does any pydantic value (pickled results, JSON in the API),
the CLI prints `model_dump(mode="json")` for `--json`, and callers read attributes, so a renamed or
missing field fails where it is read, not as a `KeyError` three stages later.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Outcome(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PlanOutcome(_Outcome):
    """plan_flow: the stored search (or why no plan is feasible)."""

    feasible: bool
    cached: bool  # the search result came from the task cache
    search_key: str | None = None  # the stored search (storage.plans), None when infeasible
    best_plan_id: str | None = None  # the best plan's fingerprint (`meshplan train --plan-id`)
    reasons: list[str] = []  # why no plan is feasible
    step_time_s: float | None = None  # the best plan's predicted step time
    num_devices: int | None = None  # devices the best plan uses
    num_candidates: int | None = None  # plans the search priced
    complete: bool | None = None  # the search explored its whole space
    gap_fraction: float | None = None  # at most this far from the optimum when cut by the time budget


class TrainOutcome(_Outcome):
    """train_flow: the run, its telemetry and, when supervised, the re-planning it did."""

    run_id: str
    run_dir: str
    status: Literal["completed", "failed"]
    num_telemetry_rows: int  # step-metric rows ingested (steps × ranks)
    measured_step_time_s: float | None  # median over steps of the slowest rank, warm-up skipped
    predicted_step_time_s: float | None  # the plan's prediction, when it has one
    losses: list[float | None]  # per step, from the last stage
    decisions: list[dict[str, Any]] = []  # storage.replan records of the live monitor
    final_detections: list[dict[str, Any]] = []  # slowdowns the monitor held at the end
    segments: list[dict[str, Any]] = []  # one per torchrun launch of the supervisor
    final_plan_json: str  # the plan the run finished on (after rebalances and relayouts)
    events: list[dict[str, Any]] = []  # restarts, checkpoint fallbacks, resumes (storage/runs.py run_events)
    slurm_job_id: str | None = None  # the sbatch job that ran it (executor slurm)
    val_losses: list[tuple[int, float]] = []  # (steps done, validation loss) per evaluation (--eval-every)
    launch_wall_s: float | None = None  # torchrun's wall time (unsupervised launches)


class ReplanOutcome(_Outcome):
    """replan_flow: the decision for a stored run."""

    run_id: str
    detected: bool
    action: str  # keep | rebalance | relayout
    reason: str
    acted: bool  # a live run's control file was written
    decision_id: int | None = None  # its row in replan_decisions, None when nothing was detected
    detections: list[dict[str, Any]] = []


class JobSegment(_Outcome):
    """One launch of an elastic job (flows/job.py): on which allocation, which steps, how it ended."""

    allocation: str  # as the scheduler wrote it, e.g. "4xcpu/1"
    plan_fingerprint: str
    from_step: int  # the checkpoint it resumed from
    to_step: int  # the latest checkpoint when it exited
    exit: Literal["done", "requested", "error"]  # trained to the end | asked to exit (resize, stop) | died


class JobOutcome(_Outcome):
    """job_flow: one queued job's elastic life."""

    job_id: str
    state: str  # the job's state at the end: finished, failed, cancelled, or queued when stopped
    run_dir: str
    segments: list[JobSegment]


class SchedulerOutcome(_Outcome):
    """scheduler_flow: one round of the multi-job scheduler."""

    actions: list[tuple[str, str, str]]  # (job_id, start | grow | shrink | ..., allocation)
    rejections: list[tuple[str, str]]  # (job_id, reason)
    waiting: list[str]  # job ids left in the queue
    applied: list[dict[str, Any]]  # tasks.scheduler.apply_round's record per job (runner_pid when started)
    requeued: list[str]  # running jobs whose runner was gone, back in the queue
    skipped: str = ""  # why this round did nothing: another round held the lease, or it was collapsed


class DiscoverOutcome(_Outcome):
    """discover_flow: the recorded hardware snapshot."""

    fingerprint: str  # the snapshot's id (storage.hardware)
    reused: bool  # a stored snapshot of this hardware was reused, nothing measured
    source: Literal["probe", "file"]  # measured on this machine, or read from a cluster file
    name: str  # the cluster's name
    num_nodes: int
    num_devices: int


class KindEfficiency(_Outcome):
    """The fraction of catalog peak a device kind's estimated profiles assume, and where it came from."""

    efficiency: float
    source: str


class ProfileOutcome(_Outcome):
    """profile_flow: what was measured, reused and estimated."""

    model: str
    fingerprint: str  # the model's fingerprint (profiles are keyed by it)
    device_kinds: list[str]  # profiled (measured here or estimated)
    local_device: str  # this machine's device kind
    torch_version: str
    measured: int  # layer-profile rows measured now
    reused: int  # rows already stored for this model and torch version
    estimated: int  # roofline rows for kinds not present here
    profiler_runs: int  # profiler subprocesses started
    efficiency: dict[str, KindEfficiency] = {}  # per estimated kind
    comm_fits: list[dict[str, Any]] = []  # discovery's α–β fits for this hardware
    failed: list[str] = []  # profiler groups (or the optimizer step) that failed
    run_dir: str
    optimizer: dict[str, float | int] = {}  # AdamW step seconds per parameter by layout, and num_ranks (CPU)
    optimizer_measured: int = 0  # 1 when the optimizer step was measured now


class DryRunStage(_Outcome):
    stage: int
    layers: list[int]
    tp: int
    dp: int
    ranks: list[int]
    device_ids: list[int]


class DryRunOutcome(_Outcome):
    """dry_run_flow: the plan launched for a few steps on this machine, and what went wrong."""

    ok: bool
    plan: str  # the plan's fingerprint
    world_size: int
    schedule: str  # the pipeline schedule (1f1b, interleaved-1f1b, gpipe)
    num_microbatches: list[int]
    stages: list[DryRunStage]
    steps: int
    steps_done: int
    losses: list[float | None]
    model: dict[str, Any]  # the ModelSpec, as JSON
    problems: list[str]
    lines: list[str]  # the report as printed
    run_id: str
    run_dir: str
    wall_s: float


class PipelineOutcome(_Outcome):
    """pipeline_flow (`meshplan run`): what each stage did."""

    snapshot: DiscoverOutcome
    profile: ProfileOutcome
    plan: PlanOutcome
    run: TrainOutcome
    first_loss: float | None
    last_loss: float | None


class DataOutcome(_Outcome):
    """`data_prepare_flow`: the dataset folder written and what it holds (its manifest.json has it all)."""

    out_dir: str
    vocab_size: int
    dtype: str
    eos_id: int | None
    num_train_documents: int
    num_train_tokens: int
    num_val_documents: int
    num_val_tokens: int
    elapsed_s: float
    tokens_per_s: float


class ExportOutcome(_Outcome):
    """`export_weights_flow`: the Hugging Face folder written from one checkpoint of a run."""

    run_id: str
    out_dir: str
    step: int
    architecture: str  # gpt2 | llama | qwen2
    tokenizer: str | None  # the tokenizer.json copied beside the weights
    num_params: int


class ServeOutcome(_Outcome):
    """serve_flow: a placement served on torch ranks behind the router; every request recorded."""

    run_id: str
    run_dir: str
    recorded: int  # rows written to serve_requests (answered, dropped, failed, refused alike)
    statuses: list[int] = []  # HTTP status of each replayed request, in trace order
    calibration: dict[str, tuple[float, ...]] = {}  # str((model, pp, tp, batch)) -> seconds per stage
    serving: dict[str, dict[str, float]] = {}  # device kind -> fitted serving figures (serve_calibrations)
    group_events: list[dict[str, Any]] = []  # a group's ranks died / restarted / given up (launcher/serving.py)
    measured: list[dict[str, Any]] = []  # replay only: per model, from serve_requests
    simulated: list[dict[str, Any]] = []  # the simulator's per-model table for the replay, calibrated
    simulated_nominal: list[dict[str, Any]] = []  # the same on the trace's own arrival times
    groups: list[dict[str, Any]] = []  # per group: layout, models, served / dropped, p50 / p99
    arrival_late_s: dict[str, float] | None = None  # how late requests reached the router (p50, max)
