"""The scheduler drives real ranks with its default policy, srtf: two jobs on a 4-rank CPU "cluster".

scheduler_flow rounds (real Prefect runs) over a real DuckDB queue start each job's elastic runner
(flows/job.py, its own process, train_flow inside) and resize a job through a checkpoint. The
scheduler's prices come from a speed table (the `--speed` source: 1 rank 1.0 s, 2 ranks 0.5 s,
4 ranks 0.4 s a step). A short job a and a long job b arrive together; srtf
(planner/scheduler/srtf.py) starts both on their smallest allocation (1 rank) and grows the short
one to 2 — not b, and not to 4: while jobs arrive, growth keeps one device (the last hour's arrivals
per round, rounded up) free for the next arrival. (jct gives each 2 ranks at once.) Once a finishes,
b grows to 2 ranks through a checkpoint (one rank still held back). Both finish; each one's final
weights equal an uninterrupted single-process run's (SGD, so a lost, repeated or mis-resharded step
would show). Every start and resize is recorded with srtf's reason.
"""

from __future__ import annotations

import signal
import time

import pytest

from flows.outcomes import SchedulerOutcome
from flows.scheduler import scheduler_flow
from launcher import group
from planner.specs.config import TrainConfig
from planner.specs.model import get_model
from storage.jobs import get_job, job_events, submit_job
from tests.flows.test_elastic_job import ATOL, CLUSTER, TRAIN, rank0_rows
from tests.support.reference import train_reference
from worker.checkpoint import latest_checkpoint, load_full_model_state

pytestmark = [pytest.mark.dist, pytest.mark.flow]

TABLE = "model_cfg,gpu_type,num_gpus,num_nodes,gpus_per_node,sim_iter_time_s\n" + "".join(
    f"tiny,cpu,{n},1,{n},{t}\n" for n, t in ((1, 1.0), (2, 0.5), (4, 0.4))
)
# seconds-long jobs: a relaunch priced at 5 s, and any gain above 0.5 s worth a switch
POLICY = {"relaunch_s": 5.0, "min_gain_s": 0.5}
# b must outlast a, the round that sees a finished and b's checkpoint by some steps, or it never trains
# on 2 ranks; a round took up to ~11 s on a loaded CI VM. With 16 samples a step b ran 3x a's pace (no
# all-reduce) and reached step 227 before its resize; with 32 it reached step 123 (3x a's 40)
A_STEPS, B_STEPS = 40, 300
A_BATCH, B_BATCH = 32, 32
# long runs turn the tiny model chaotic: summation-order drift across rank counts reached 3.4e-5 over
# 200 steps at lr 0.02; at lr 0.01 it is ~1e-7, while one lost or repeated step moves the weights
# ~9e-3 at lr 0.02 (tests/flows/test_replan_flow.py), about half that at 0.01 -- still 40x the tolerance
TRAIN_LONG = {**TRAIN, "lr": 0.01}


def _params_error(run_dir, steps: int, batch: int) -> float:
    ref, _ = train_reference(get_model("tiny"), batch, 32, steps, "synthetic", 0, TRAIN_LONG["lr"], "sgd")
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    got = load_full_model_state(ckpt, get_model("tiny"))
    return max((got[k] - ref[k]).abs().max().item() for k in ref)


def test_srtf_starts_both_jobs_small_grows_the_long_one_when_the_short_one_ends_both_match_uninterrupted_runs(
    tmp_path,
):
    db, runs, table = str(tmp_path / "m.duckdb"), tmp_path / "runs", tmp_path / "speed.csv"
    table.write_text(TABLE)

    def round_() -> SchedulerOutcome:  # the default policy: no `policy` argument
        return scheduler_flow(
            db,
            CLUSTER,
            speed_table=str(table),
            policy_options=POLICY,
            runs_dir=str(runs),
            train=TrainConfig(timeout_s=600.0),
        )

    submit_job(db, "tiny", A_BATCH, A_STEPS, job_id="a", seq=32, train=TRAIN_LONG)
    submit_job(db, "tiny", B_BATCH, B_STEPS, job_id="b", seq=32, train=TRAIN_LONG)
    pids: list[int] = []
    try:
        _rounds(db, runs, round_, pids)
    finally:  # a failed assertion must not leave runners (and their ranks) behind: SIGTERM ends both
        for pid in pids:
            group.send(pid, signal.SIGTERM)


def _rounds(db: str, runs, round_, pids: list[int]) -> None:
    first = round_()
    pids += [x["runner_pid"] for x in first.applied if x.get("runner_pid")]
    # both on their smallest allocation, the short one grown by one rank, the last rank left free
    assert first.actions == [("a", "start", "2xcpu/1"), ("b", "start", "1xcpu/1")]
    assert get_job(db, "a")["base_allocation"] == get_job(db, "b")["base_allocation"] == "1xcpu/1"
    t_end = time.monotonic() + 400
    while get_job(db, "a")["state"] not in ("finished", "failed") and time.monotonic() < t_end:
        time.sleep(0.5)  # the runners write the same database: poll it gently
    assert get_job(db, "b")["state"] == "running", ("b ended before a", (runs / "b" / "job.log").read_text()[-3000:])
    assert round_().actions == [("b", "grow", "2xcpu/1")]
    later: list[tuple[str, str, str]] = []
    t_end = time.monotonic() + 400
    while time.monotonic() < t_end:
        states = {j: get_job(db, j)["state"] for j in ("a", "b")}
        if set(states.values()) <= {"finished", "failed"}:
            break
        later += round_().actions  # nothing more to do: b keeps 2 ranks (one held back for arrivals)
        time.sleep(1.0)
    assert states == {"a": "finished", "b": "finished"}, (states, (runs / "b" / "job.log").read_text()[-3000:])
    assert later == [], later

    a_events, b_events = job_events(db, "a").to_dicts(), job_events(db, "b").to_dicts()
    assert [e["to_state"] for e in a_events] == ["queued", "running", "finished"]
    assert [e["to_state"] for e in b_events][:4] == ["queued", "running", "resizing", "running"]
    assert b_events[-1]["to_state"] == "finished"
    # the policy that decided: every start and resize is recorded with srtf's reason
    decided = [
        e["reason"]
        for e in a_events + b_events
        if e["to_state"] in ("running", "resizing") and e["from_state"] in ("queued", "running")
    ]
    assert len(decided) == 3 and all(r.startswith("srtf: ") for r in decided), decided
    rows = rank0_rows(runs / "a")
    assert [r["step"] for r in rows] == list(range(A_STEPS)) and {r["dp"] for r in rows} == {2}
    rows = rank0_rows(runs / "b")
    assert [r["step"] for r in rows] == list(range(B_STEPS)), "b trained every step once, in order"
    assert rows[0]["dp"] == 1 and rows[-1]["dp"] == 2, "b ran on 1 rank, then on 2"
    assert _params_error(runs / "a", A_STEPS, A_BATCH) < ATOL
    assert _params_error(runs / "b", B_STEPS, B_BATCH) < ATOL
