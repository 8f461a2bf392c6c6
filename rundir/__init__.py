"""The run folder, one owner for its layout (stdlib only: the bottom of the house).

Every layer that touches a run folder — the ranks (worker), the launcher, the tasks, storage's
telemetry ingest and the flows — names its files through this module, so a file is spelled once
and the scheduler reads the latest checkpoint's step with the same code the ranks' layout implies
(no layer re-implements another's reader because it may not import it).

    <run>/plan.json                  the plan the ranks read (flows/train.py copies it in)
    <run>/model.json                 the ModelSpec the ranks build (every training run; dry runs: scaled down)
    <run>/runspec.json               the RunSpec the ranks were told (its data folder, init weights, ...)
    <run>/eval.jsonl                 validation loss per evaluation (worker/train.py; table eval_metrics)
    <run>/plans/segment_N.json       a job's plan for its N-th launch (flows/job.py)
    <run>/torchrun.log               node 0's agent and ranks; torchrun.nodeR.log for node R
    <run>/job.log                    a queued job's runner (tasks/schedule.py)
    <run>/telemetry/rank_RRRRR.jsonl one JSON line per rank and step (worker/telemetry.py)
    <run>/checkpoints/step_NNNNNNNN/ a DCP checkpoint and its meta.json (worker/checkpoint.py)
    <run>/checkpoints/latest         text: the newest published checkpoint's folder name
    <run>/resume.jsonl               one line per (re)start: what it resumed from, what it skipped
    <run>/control.json               flow → ranks orders and the generation (launcher/control.py)
    <run>/.control.lock              held while control.json is read-modified-written
    <run>/exit.json                  rank 0's note of a requested checkpoint-and-exit
    <run>/sbatch.sh                  the batch script of a Slurm launch or discovery (launcher/slurm.py)
    <run>/slurm-<job id>.out         that batch job's output
    <profile>/<kind>-seq<S>-tp<T>-<digest>.jsonl   a layer profiler's rows (tasks/profile.py)

A serving run folder (`meshplan serve`, launcher/serving.py):

    <serve>/placement.json           the placement the ranks read (written once by the flow process)
    <serve>/serve.groupG.log         group G's torchrun agent and ranks, every generation appended
    <serve>/calib_rankR.json         start-up stage times of tp rank 0 of a stage (global rank R)
    <serve>/stage_rankR.json         that rank's per-request service log, written as it ends
    <serve>/router.json              the router's arrival / finish times of a replay
    <run>/snapshot.json              a discovery's hardware snapshot (worker/netbench.py's rank 0)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

PLAN = "plan.json"
MODEL = "model.json"
SPEC = "runspec.json"
TORCHRUN_LOG = "torchrun.log"
JOB_LOG = "job.log"
TELEMETRY = "telemetry"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
META = "meta.json"
RESUME_LOG = "resume.jsonl"
EVAL_LOG = "eval.jsonl"  # validation loss per evaluation (worker/train.py; table eval_metrics)
CONTROL = "control.json"
CONTROL_LOCK = ".control.lock"
EXIT = "exit.json"
SBATCH = "sbatch.sh"
SERVE_PLACEMENT = "placement.json"
ROUTER_LOG = "router.json"
SNAPSHOT = "snapshot.json"
STEP_DIR = re.compile(r"^step_(\d+)$")  # a published checkpoint's folder name; group 1 is its step


def plan_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / PLAN


def model_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / MODEL


def spec_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / SPEC


def segment_plan_path(run_dir: str | Path, n: int) -> Path:
    return Path(run_dir) / "plans" / f"segment_{n}.json"


def node_log(run_dir: str | Path, node_rank: int = 0) -> Path:
    """Node 0's torchrun log is the run's `torchrun.log` (as with one node); node R's `torchrun.nodeR.log`."""
    return Path(run_dir) / (TORCHRUN_LOG if node_rank == 0 else f"torchrun.node{node_rank}.log")


def sbatch_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / SBATCH


def snapshot_path(run_dir: str | Path) -> Path:
    """A discovery's hardware snapshot, written by the network bench's rank 0 (worker/netbench.py)."""
    return Path(run_dir) / SNAPSHOT


def job_log(run_dir: str | Path) -> Path:
    return Path(run_dir) / JOB_LOG


def slurm_log(run_dir: str | Path, job_id: str) -> Path:
    """A Slurm batch job's output (every node's torchrun, through srun); `job_id` "%j" gives sbatch's pattern."""
    return Path(run_dir) / f"slurm-{job_id}.out"


def profile_out_path(profile_dir: str | Path, device_kind: str, seq_len: int, tp: int, digest: str) -> Path:
    """A layer profiler's out file (one device kind, seq, tp group), named by its content's `digest`
    so a retry or a rerun resumes it."""
    return Path(profile_dir) / f"{device_kind}-seq{seq_len}-tp{tp}-{digest}.jsonl"


def telemetry_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / TELEMETRY


def telemetry_path(run_dir: str | Path, rank: int) -> Path:
    return telemetry_dir(run_dir) / f"rank_{rank:05d}.jsonl"


def telemetry_files(run_dir: str | Path) -> list[Path]:
    """Every rank's telemetry file, in rank order."""
    return sorted(telemetry_dir(run_dir).glob("rank_*.jsonl"))


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def latest_marker(run_dir: str | Path) -> Path:
    return checkpoints_dir(run_dir) / LATEST


def checkpoint_name(step: int) -> str:
    """A published checkpoint's folder name (what the `latest` marker holds)."""
    return f"step_{step:08d}"


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / checkpoint_name(step)


def checkpoint_staging_dir(run_dir: str | Path, step: int, kind: str = "tmp") -> Path:
    """Where a save writes before its rename (`.tmp_step_N`), or where a replaced one is put aside
    (`.old_step_N`); never resume candidates (STEP_DIR does not match them)."""
    return checkpoints_dir(run_dir) / f".{kind}_{checkpoint_name(step)}"


def checkpoint_meta(ckpt_dir: str | Path) -> Path:
    """A checkpoint folder's meta.json (step, plan, generation, file digests)."""
    return Path(ckpt_dir) / META


def resume_log(run_dir: str | Path) -> Path:
    return Path(run_dir) / RESUME_LOG


def eval_log(run_dir: str | Path) -> Path:
    return Path(run_dir) / EVAL_LOG


def control_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONTROL


def control_lock_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONTROL_LOCK


def exit_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / EXIT


def latest_checkpoint_step(run_dir: str | Path | None) -> int:
    """Steps saved by the run folder's latest published checkpoint (0: none, or unreadable).

    Only the marker and meta.json's `step` are read (the flow side's progress figure); resuming
    verifies the folder's digests first (worker/checkpoint_check.py)."""
    if not run_dir:
        return 0
    try:
        name = latest_marker(run_dir).read_text().strip()
        return int(json.loads(checkpoint_meta(checkpoints_dir(run_dir) / name).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def serve_placement_path(run_dir: str | Path) -> Path:
    """The placement a serving run's ranks read."""
    return Path(run_dir) / SERVE_PLACEMENT


def serve_log(run_dir: str | Path, group: int) -> Path:
    """A serving group's torchrun log (its ranks' output, every generation appended)."""
    return Path(run_dir) / f"serve.group{group}.log"


def serve_calib_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"calib_rank{rank}.json"


def serve_stage_log_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"stage_rank{rank}.json"


def serve_calib_files(run_dir: str | Path) -> list[Path]:
    return sorted(Path(run_dir).glob("calib_rank*.json"))


def serve_stage_log_files(run_dir: str | Path) -> list[Path]:
    return sorted(Path(run_dir).glob("stage_rank*.json"))


def router_log_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / ROUTER_LOG


# the state folder's layout (rundir/state.py), re-exported: `rundir.StateDir`
from rundir.state import StateDir as StateDir  # noqa: E402
from rundir.state import backups_dir as backups_dir  # noqa: E402
from rundir.state import db_problem as db_problem  # noqa: E402
from rundir.state import id_problem as id_problem  # noqa: E402
from rundir.state import inside as inside  # noqa: E402
