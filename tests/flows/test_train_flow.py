"""A real Prefect run of the train flow: torchrun on 2 gloo ranks, telemetry ingested into DuckDB."""

import json
import re
from pathlib import Path

import pytest

from flows.requests import TrainRequest
from flows.train import train_flow
from planner.errors import MeshplanError
from planner.specs.plan import CostBreakdown, parse_plan
from planner.specs.runspec import RunSpec
from storage.db import query
from storage.runs import load_run
from tests.support.cli import meshplan_main

pytestmark = [pytest.mark.dist, pytest.mark.flow]
PROGRESS = re.compile(
    r"train: steps (\d+)/(\d+) \(\d+%\) \| loss [-\d.]+ \| step [\d.]+ ms \| [-\d,]+ tok/s \| ETA [-\d:]+"
)

PREDICTED = CostBreakdown(
    step_time_s=0.05,
    compute_s=0.04,
    bubble_s=0.01,
    pp_comm_s=0,
    dp_comm_s=0,
    tp_comm_s=0,
    optimizer_s=0,
    tokens_per_s=5000,
    mfu=0.1,
    peak_memory_bytes=(1, 1),
    memory_capacity_bytes=(2, 2),
    bottleneck="compute",
)


def _plan_file(tmp_path: Path) -> str:
    plan = parse_plan(
        {
            "model": "tiny",
            "cluster": "cpu",
            "global_batch_size": 8,
            "seq_len": 32,
            "micro_batch_size": 2,
            "schedule": "1f1b",
            "dtype": "fp32",
            "batch_shares": [8],
            "stages": [
                {"layer_start": 0, "layer_end": 1, "device_ids": [0]},
                {"layer_start": 1, "layer_end": 4, "device_ids": [1]},
            ],
        }
    ).model_copy(update={"predicted": PREDICTED})
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return str(path)


def _artifact(key: str, flow_run_id) -> str:
    """The `key` artifact this flow run published (not the newest one: other tests publish the same keys)."""
    import asyncio

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
                )
            )

    found = asyncio.run(read())
    assert len(found) == 1, f"{len(found)} {key!r} artifacts for flow run {flow_run_id}"
    return found[0].data


def _progress_lines(text: str) -> list[tuple[int, int, str]]:
    return [(int(m[1]), int(m[2]), m[0]) for m in PROGRESS.finditer(text)]


def _logs_with(text: str, wait_s: float = 20.0) -> list[str]:
    """Prefect run-log messages containing `text` (the log handler ships them in the background)."""
    import asyncio
    import time

    from prefect import get_client

    async def read():
        async with get_client() as client:
            return await client.read_logs()

    deadline = time.monotonic() + wait_s
    while True:
        found = [lg.message for lg in asyncio.run(read()) if text in lg.message]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_train_flow_launches_torchrun_and_lands_step_metrics(tmp_path, capsys, monkeypatch):
    db = str(tmp_path / "m.duckdb")
    request = TrainRequest(
        plan_path=_plan_file(tmp_path),
        spec=RunSpec(steps=4, data="text", lr=0.01, checkpoint_every=2),
        nproc_per_node=2,
        timeout_s=300,
        show_progress=True,
    )
    state = train_flow(db, request, "flow-run", return_state=True)
    out = state.result()
    assert out.status == "completed" and out.num_telemetry_rows == 4 * 2  # 4 steps x 2 ranks
    rows = query(
        db,
        "SELECT rank, stage, step, loss, step_time_s, compute_s, comm_wait_s FROM step_metrics "
        "WHERE run_id = 'flow-run' ORDER BY rank, step",
    )
    assert rows["rank"].to_list() == [0] * 4 + [1] * 4
    assert rows.filter(rows["stage"] == 0)["loss"].null_count() == 4  # loss only on the last stage
    assert (rows["compute_s"] > 0).all() and (rows["comm_wait_s"] >= 0).all()
    losses = out.losses
    assert losses[-1] < losses[0], f"loss must fall on the text corpus: {losses}"
    run = load_run(db, "flow-run")
    assert run["status"] == "completed" and run["predicted_step_time_s"] == 0.05 and run["restarts"] == 0
    ckpts = Path(out.run_dir) / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_00000004" and (ckpts / "step_00000002" / ".metadata").is_file()
    assert json.loads((ckpts / "step_00000004" / "meta.json").read_text())["step"] == 4

    md = _artifact("train-report", state.state_details.flow_run_id)
    assert "# Training run `flow-run` — completed" in md
    assert "predicted | 50.0 ms" in md and "measured / predicted" in md

    # the progress display while torchrun ran (plain lines: pytest's stdout is not a terminal)
    lines = _progress_lines(capsys.readouterr().out)
    assert lines, "no training progress line on stdout"
    done = [d for d, _, _ in lines]
    assert all(total == 4 for _, total, _ in lines) and done == sorted(done) and len(set(done)) == len(done)
    assert 1 <= done[0] and done[-1] == 4
    last = lines[-1][2]
    assert f"loss {losses[-1]:.4f}" in last and "ETA 0:00:00" in last  # the run_steps loss of the last step
    assert out.events == []  # a clean first run survived nothing

    # A bit-flipped newest checkpoint: `meshplan train` falls back to step 2 and says so on the
    # console, on the run (run_events) and in the Prefect run's log.
    shard = ckpts / "step_00000004" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    cli = ["--state-dir", str(tmp_path), "--db", db, "train", "--plan", _plan_file(tmp_path), "--steps", "4"]
    cli += ["--nproc-per-node", "2", "--data", "synthetic", "--run-id", "flow-run", "--no-replan"]
    rc, stdout, stderr = meshplan_main(monkeypatch, capsys, *cli)
    assert rc == 0, stderr
    assert "run flow-run completed" in stdout
    assert f"fallback: checkpoint {ckpts / 'step_00000004'} skipped: __1_0.distcp sha256" in stdout
    assert f"resume: resumed from step 2 ({ckpts / 'step_00000002'})" in stdout
    from storage.runs import run_events

    assert [(e["kind"], e["step"]) for e in run_events(db, "flow-run")] == [("fallback", None), ("resume", 2)]
    assert _logs_with("run flow-run: fallback: checkpoint") and _logs_with("run flow-run: resume: resumed from step 2")

    # Every checkpoint unreadable: the run stops, naming the folder and the way out, instead of
    # silently training from step 0.
    for meta in ckpts.glob("step_*/meta.json"):
        meta.write_text("{garbage")
    rc, stdout, stderr = meshplan_main(monkeypatch, capsys, *cli)
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert rc == 1 and "Traceback" not in stderr and len(lines) == 1, stderr
    assert str(ckpts) in lines[0] and "checkpoints are unreadable" in lines[0] and "--fresh-start" in lines[0]
    assert load_run(db, "flow-run")["status"] == "failed"


def test_meshplan_train_shows_step_progress_while_the_supervised_job_runs(tmp_path):
    """`meshplan train` (the command itself, in this process so it uses the test's Prefect server
    rather than starting its own): on one node the job runs under the re-planning supervisor, whose
    telemetry polling drives the progress lines; they count up to the requested steps."""
    from typer.testing import CliRunner

    from cli.main import app

    args = [
        "--state-dir",
        str(tmp_path / "state"),
        "train",
        "--plan",
        _plan_file(tmp_path),
        "--steps",
        "6",
        "--nproc-per-node",
        "2",
        "--data",
        "synthetic",
        "--run-id",
        "cli",
    ]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    lines = _progress_lines(res.stdout)
    assert lines, f"no training progress line on stdout:\n{res.stdout}"
    done = [d for d, _, _ in lines]
    assert all(total == 6 for _, total, _ in lines) and done == sorted(done) and done[-1] == 6
    assert "run cli completed: 6 steps" in res.stdout
    last_loss = re.search(r"loss [\d.]+ -> ([\d.]+)", res.stdout)[1]
    assert f"loss {last_loss} |" in lines[-1][2]  # the same number the run's summary reports


def test_train_flow_rejects_a_device_count_mismatch(tmp_path):
    with pytest.raises(MeshplanError, match="nproc_per_node"):
        train_flow(
            str(tmp_path / "m.duckdb"),
            TrainRequest(plan_path=_plan_file(tmp_path), spec=RunSpec(steps=1), nproc_per_node=3),
        )


def test_train_flow_rejects_a_plan_for_another_model_before_launching(tmp_path):
    with pytest.raises(MeshplanError, match="layer_end"):  # the plan covers 4 blocks; gpt2-small has 12
        train_flow(
            str(tmp_path / "m.duckdb"),
            TrainRequest(plan_path=_plan_file(tmp_path), spec=RunSpec(steps=1, model="gpt2-small")),
        )
    assert not (tmp_path / "runs").exists()


def test_train_flow_with_an_unknown_plan_id_is_a_user_error(tmp_path):
    with pytest.raises(MeshplanError, match="--plan-id"):
        train_flow(str(tmp_path / "m.duckdb"), TrainRequest(plan_id="no-such-plan", spec=RunSpec(steps=1)))


def test_stored_plan_is_read_by_its_fingerprint(tmp_path):
    from storage.plans import save_plans
    from tasks.train import load_stored_plan

    db = str(tmp_path / "m.duckdb")
    plan = parse_plan(json.loads(Path(_plan_file(tmp_path)).read_text()))
    save_plans(db, [plan])
    assert load_stored_plan.fn(db, plan.fingerprint()) == plan


def test_ranks_per_node_default_to_the_plans_devices_per_node(tmp_path):
    """No --nproc-per-node: the launch runs the plan's devices ÷ nodes (a 1-device plan on a 2-rank
    machine trains on 1 rank, as `meshplan plan --out` then `meshplan train --plan` expects); a node
    count that does not divide the plan's devices is one error naming --nnodes."""
    from flows.train import prepare_launch

    db = str(tmp_path / "m.duckdb")
    plan = _plan_file(tmp_path)
    _, _, launch = prepare_launch(db, TrainRequest(plan_path=plan, spec=RunSpec(steps=1)), "r1")
    assert (launch.nproc_per_node, launch.nnodes) == (2, 1)
    with pytest.raises(MeshplanError, match="--nnodes"):
        prepare_launch(db, TrainRequest(plan_path=plan, spec=RunSpec(steps=1), nnodes=3), "r2")


def test_a_diverged_run_is_one_line_and_failed_never_completed(tmp_path):
    """SGD at the largest --lr accepted blows tiny up by step 7: the ranks stop together
    (worker/train.py `_diverged`), the flow raises their one line (step, values, --lr), the run row
    is `failed` with it."""
    db = str(tmp_path / "m.duckdb")
    spec = RunSpec(steps=8, data="synthetic", optimizer="sgd", lr=10.0, checkpoint_every=0)
    request = TrainRequest(plan_path=_plan_file(tmp_path), spec=spec, nproc_per_node=2, timeout_s=300, replan=False)
    with pytest.raises(MeshplanError, match=r"--lr=10.0: training diverged at step \d") as err:
        train_flow(db, request, "diverged")
    assert "\n" not in str(err.value) and "lower --lr" in str(err.value)
    run = query(db, "SELECT status, message FROM runs WHERE run_id = 'diverged'").to_dicts()
    assert run == [{"status": "failed", "message": str(err.value)}]
