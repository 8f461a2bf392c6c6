"""No secret from the environment ends up in the database, the run folder or Prefect's records.

Real train flows (torchrun on 2 gloo ranks, telemetry ingested into DuckDB, artifacts published) run
with fake credentials in the environment — one completed run and one whose rank crashes, because
failure paths copy log tails into the database and the flow's error. Then every stored byte is
searched: every DuckDB table (SELECT * as text), every file of both run folders, Prefect's
artifacts, flow-run parameters, logs and persisted task results. The runs' ids are searched the
same way first, so a search that could not find anything fails instead of passing.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import duckdb
import pytest

from flows.requests import TrainRequest
from flows.train import train_flow
from planner.specs.faults import FaultSpec
from planner.specs.plan import parse_plan
from planner.specs.runspec import RunSpec

pytestmark = [pytest.mark.dist, pytest.mark.flow]

SECRET_VARS = ("MESHPLAN_TEST_SECRET", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY")


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
                {"layer_start": 0, "layer_end": 2, "device_ids": [0]},
                {"layer_start": 2, "layer_end": 4, "device_ids": [1]},
            ],
        }
    )
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return str(path)


def _database_text(db: str) -> str:
    con = duckdb.connect(db, read_only=True)
    try:
        names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        rows = {t: con.execute(f'SELECT * FROM "{t}"').fetchall() for t in names}
        return "\n".join(f"{t}: {r!r}" for t, r in rows.items())
    finally:
        con.close()


def _folder_bytes(folder: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


async def _prefect_text() -> str:
    from prefect import get_client

    async with get_client() as client:
        artifacts = await client.read_artifacts()
        runs = await client.read_flow_runs()
        logs = await client.read_logs()
    parts = [json.dumps([[a.data, a.description, a.key] for a in artifacts], default=str)]
    parts += [json.dumps(r.parameters, default=str) + str(r.state.message if r.state else "") for r in runs]
    parts += [lg.message for lg in logs]
    return "\n".join(parts)


def test_no_secret_reaches_the_database_run_folders_or_prefect(tmp_path, monkeypatch):
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH

    secrets = {v: f"s3cr3t-{v.lower()}-{uuid.uuid4().hex}" for v in SECRET_VARS}
    for var, value in secrets.items():
        monkeypatch.setenv(var, value)
    db, runs = str(tmp_path / "m.duckdb"), str(tmp_path / "runs")
    common = dict(
        plan_path=_plan_file(tmp_path),
        nproc_per_node=2,
        runs_dir=runs,
        timeout_s=300,
    )
    run = RunSpec(steps=3, data="synthetic", checkpoint_every=2, collective_timeout_s=60)
    ok = train_flow(db, TrainRequest(spec=run, **common), "secret-ok")
    assert ok.status == "completed"
    crash = FaultSpec(kill_rank=1, kill_step=1)  # rank 1 SIGKILLs itself at step 1: the failure path
    with pytest.raises(Exception, match="torchrun exited"):
        train_flow(db, TrainRequest(spec=run.model_copy(update={"faults": crash}), **common), "secret-crash")

    stores = {
        "database": _database_text(db).encode(),
        "run folders": _folder_bytes(Path(runs)),
        "prefect api": asyncio.run(_prefect_text()).encode(),
        "prefect results": _folder_bytes(Path(PREFECT_LOCAL_STORAGE_PATH.value())),
    }
    for name in ("database", "run folders", "prefect api"):  # the search must be able to find things
        assert b"secret-ok" in stores[name] and b"secret-crash" in stores[name], name
    assert b"torchrun exited" in stores["database"]  # the crash's log tail was stored: it was searched
    leaks = [(where, var) for where, blob in stores.items() for var, v in secrets.items() if v.encode() in blob]
    assert leaks == [], f"secret values found in: {leaks}"
