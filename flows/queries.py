"""What the CLI reads from the state, and the few small writes it makes without a Prefect flow.

The CLI (cli/) calls flows and these functions, never storage or tasks (pyproject's contract "the
CLI calls flows"): so what a command may touch is decided here, beside the flows that do the same
work with Prefect, and a command that needs a new read adds a function here. No Prefect is imported
(the commands call these after `prefect_env`, or without it, and `meshplan plan` without `--flow`
must not start a Prefect server); DuckDB errors come back as MeshplanError, so the CLI imports no
DuckDB.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from planner.errors import MeshplanError
from planner.specs.config import ProfileConfig, SearchConfig
from planner.specs.model import ModelSpec
from storage import pricing as _pricing
from storage.pricing import PricingInputs

if TYPE_CHECKING:  # types only: `estimate` and `compare` need neither the search (numpy) nor polars
    import polars as pl

    from planner.cost.runtimes import Pricing
    from planner.search import NoFeasiblePlan, SearchResult
    from planner.specs.cluster import ClusterSpec
    from planner.specs.plan import CostBreakdown, Plan
    from planner.specs.runspec import RunOptions
    from storage.hardware import HardwareSnapshot

T = TypeVar("T")

# ---- pricing: the inputs and runtime figures the search and `estimate` price with


def pricing_inputs(
    db: str | Path,
    model: ModelSpec,
    cluster_file: str | Path | None = None,
    snapshot: str | None = None,
    cpu_dtype: str = ProfileConfig().dtype,
) -> PricingInputs:
    """Cluster (a file, or a discovered snapshot), profiles, calibration and dtype for pricing `model`,
    as plan_flow's tasks read them (storage.pricing)."""
    return _pricing.pricing_inputs(db, model, cluster_file, snapshot, cpu_dtype)


def runtime_pricing(db: str | Path, cluster: ClusterSpec, runtime: str) -> Pricing:
    """What `runtime` prices plans with on `cluster` (planner.cost.runtimes.Pricing): its profile and the
    figures `meshplan calibrate` stored for (the cluster's device kind, runtime), its priors when none
    (no state folder yet: none, read without opening DuckDB). The search takes it whole."""
    from planner.cost.runtimes import device_kind_of, pricing_named, profile_named

    profile_named(runtime)  # an unknown name: one line naming the choices, before any read
    figures = None
    if Path(db).exists():
        from storage.calibrations import load_figures

        figures = load_figures(db, device_kind_of(cluster), runtime)
    return pricing_named(runtime, figures)


def price_for_runtime(
    db: Path, plan: Plan, model: ModelSpec, inputs: PricingInputs, runtime: str
) -> tuple[CostBreakdown, str]:
    """A plan's CostBreakdown under `runtime`'s figures (calibrated ones when stored), and their label."""
    from planner.cost.runtimes import device_kind_of, price

    pricing = runtime_pricing(db, inputs.cluster, runtime)
    cost = price(plan, model, inputs.cluster, pricing, profiles=inputs.profiles, calibration=inputs.calibration)
    return cost, pricing.label(device_kind_of(inputs.cluster))


# ---- the plan search in this process (`meshplan plan` without --flow)


def search_now(
    model: ModelSpec, inputs: PricingInputs, search: SearchConfig | None = None, pricing: Pricing | None = None
) -> SearchResult | NoFeasiblePlan:
    """plan_flow's search function on plan_flow's arguments, called in this process with no Prefect
    task (and no cache): the same config ranks alike either way; under `pricing` (runtime_pricing)."""
    from tasks.searching import SearchJob, run_search  # no Prefect: tasks.plan imports it

    return run_search(SearchJob.of(model, inputs, search or SearchConfig(), pricing))


def whole_cluster(inputs: PricingInputs) -> int | None:
    """The devices every plan of `inputs` uses: all of a discovered several-node cluster's (tasks.searching)."""
    from tasks.searching import whole_cluster as devices

    return devices(inputs)


def store_search(db: str | Path, result: SearchResult) -> str:
    """Upsert a search's ranked plans and baselines; returns its search key."""
    from storage.plans import save_plans

    return save_plans(db, result.plans, result.baselines)


# ---- what discovery and profiling stored


def hardware_snapshot(db: str | Path, fingerprint: str) -> HardwareSnapshot:
    """A stored discovery snapshot (storage.hardware.HardwareSnapshot: cluster, devices, links)."""
    from storage.hardware import load_snapshot

    return load_snapshot(db, fingerprint)


def profile_rows(db: str | Path, model: ModelSpec) -> pl.DataFrame:
    """Every stored layer profile row of `model`'s shapes, measured and estimated."""
    from storage.profiles import profile_frame

    return profile_frame(db, model)


def run_exists(db: str | Path, run_id: str) -> bool:
    from storage.runs import load_run

    return load_run(db, run_id) is not None


# ---- the cluster scheduler's queue


def submit_job(
    db: str | Path,
    model: str | ModelSpec,
    global_batch: int,
    iterations: int,
    *,
    job_id: str | None = None,
    seq: int | None = None,
    priority: int = 0,
    deadline_s: float | None = None,
    gpu_kinds: tuple[str, ...] = (),
    train: RunOptions | None = None,
) -> str:
    """Queue a job for scheduler_flow (storage.jobs.submit_job: its training options stored typed); its id."""
    from storage.jobs import submit_job as submit

    return submit(
        db, model, global_batch, iterations, job_id=job_id, seq=seq, priority=priority,
        deadline_s=deadline_s, gpu_kinds=gpu_kinds, train=train,
    )  # fmt: skip


def jobs(db: str | Path, state: str | None = None) -> pl.DataFrame:
    from storage.jobs import list_jobs

    return list_jobs(db, state)


def job_transitions(db: str | Path) -> pl.DataFrame:
    from storage.jobs import job_events

    return job_events(db)


def cancel_job(db: str | Path, job_id: str) -> None:
    """Cancel a job (a recorded transition); the scheduler's next round asks its ranks to exit."""
    from storage.jobs import cancel_job as cancel

    cancel(db, job_id)


# ---- calibrations stored by `meshplan calibrate`


def calibrations(db: str | Path) -> list[dict]:
    from storage.calibrations import list_figures

    return list_figures(db)


# ---- `meshplan db`: the database's tables, a query, a backup, a restore


def db_tables(db: Path) -> pl.DataFrame:
    from storage.db import tables

    return _sql_errors(None, lambda: tables(db))


def db_backup(db: Path, reason: str) -> Path:
    """Copy the database file to <state>/backups/ (the copy `db_restore` puts back); returns the copy."""
    from storage import db as store

    def run() -> Path:
        with store.connect(db) as con:
            return store.backup(con, db, reason)

    return _sql_errors(None, run)


def db_query(db: Path, sql: str, read_only: bool = True) -> tuple[pl.DataFrame, bool]:
    """The statement's result, at most MAX_DB_ROWS rows, and whether rows were cut; a statement
    running past MAX_DB_QUERY_S is stopped. A DuckDB error is a MeshplanError naming the SQL (a
    change refused in read-only mode says to add --write)."""
    from planner.limits import MAX_DB_QUERY_S, MAX_DB_ROWS
    from storage.db import query
    from storage.runs import close_dead_runs

    if db.is_file():  # a run whose command was killed reads `killed`, not `running`
        close_dead_runs(db)

    def run() -> pl.DataFrame:
        try:
            return query(db, sql, read_only=read_only, max_rows=MAX_DB_ROWS + 1, timeout_s=MAX_DB_QUERY_S)
        except TimeoutError as exc:
            raise MeshplanError("sql", sql, f"{exc}; add a WHERE or LIMIT, or aggregate") from None

    frame = _sql_errors(sql, run)
    return frame.head(MAX_DB_ROWS), frame.height > MAX_DB_ROWS


def db_restore(db: Path) -> tuple[Path, Path | None]:
    """Put the newest backup back; returns (the backup used, where the replaced file was kept)."""
    from storage.db import restore

    return restore(db)


def _sql_errors(sql: str | None, run: Callable[[], T]) -> T:
    import duckdb

    try:
        return run()
    except duckdb.Error as exc:
        if "read-only mode" in str(exc):
            raise MeshplanError("sql", sql, "this statement changes the database; add --write to run it") from None
        raise MeshplanError("sql", sql, str(exc).splitlines()[0]) from None
