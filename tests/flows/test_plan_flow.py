"""plan_flow as a real Prefect flow run: plans stored in DuckDB, artifacts attached, cache reused."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.specs.config import ProfileConfig, SearchConfig

EXAMPLES = Path(__file__).parents[2] / "examples" / "clusters"

pytestmark = pytest.mark.flow


def _artifacts(key, flow_run_id):
    """The `key` artifacts of this flow run only: other tests' plan flows publish the same keys."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
                )
            )

    return asyncio.run(read())


def test_plan_flow_stores_ranked_plans_and_attaches_artifacts(tmp_path, capsys):
    from flows.plan import plan_flow
    from storage.plans import best_plan, plans_frame

    db = str(tmp_path / "m.duckdb")
    search = SearchConfig(global_batch=32, top_k=3, time_budget_s=5.0)
    state = plan_flow(db, "gpt2-small", search, str(EXAMPLES / "mixed-a100-v100-t4.toml"), return_state=True)
    out = state.result()
    assert out.feasible
    frame = plans_frame(db, out.search_key)
    assert frame.filter(frame["baseline"] == "").height >= 1
    assert best_plan(db, out.search_key).fingerprint() == out.best_plan_id
    run_id = state.state_details.flow_run_id
    assert len(_artifacts("plan-ranking", run_id)) == 1 and len(_artifacts("plan-report", run_id)) == 1
    shown = capsys.readouterr().out  # the search's progress lines (plain: pytest's stdout is no terminal)
    assert "plan: searching gpt2-small on" in shown and f"plan: {out.num_candidates} candidates priced" in shown
    again = plan_flow(db, "gpt2-small", search, str(EXAMPLES / "mixed-a100-v100-t4.toml"))
    assert again.best_plan_id == out.best_plan_id
    assert "search result reused from the cache" in capsys.readouterr().out
    assert plans_frame(db, out.search_key).height == frame.height


def test_plan_flow_reports_an_infeasible_model(tmp_path):
    from flows.plan import plan_flow

    out = plan_flow(
        str(tmp_path / "m.duckdb"), "gpt3-175b", SearchConfig(global_batch=8), str(EXAMPLES / "mixed-a100-v100-t4.toml")
    )
    assert not out.feasible and "gpt3-175b needs" in out.reasons[0]


@pytest.fixture(scope="module")
def discovered(tmp_path_factory):
    """This machine discovered (2 CPU ranks) and the tiny model profiled, once for the module: (db, snapshot)."""
    from flows.discover import discover_flow
    from flows.profile import profile_flow

    tmp = tmp_path_factory.mktemp("discovered")
    db = str(tmp / "m.duckdb")
    snap = discover_flow(
        db,
        num_ranks=2,
        message_sizes=[1024, 65536, 1048576],
        repeats=2,
        matmul_size=256,
        timeout_s=180,
        run_dir=str(tmp / "discover"),
    )
    section = ProfileConfig(mbs=(1, 2), seq=(32,), tp=(1,), recompute=(False,), repeats=2, min_block_s=0.002)
    profile_flow(db_path=db, model_name="tiny", profile=section, comm=False, run_dir=str(tmp / "runs"))
    return db, snap.fingerprint


@pytest.mark.dist
def test_a_discovered_cpu_machine_is_planned_with_its_measured_corrections(discovered, capsys):
    """Discovery's gloo fits and the profiled optimizer step reach the search (planner.measure.calibrate): the
    stored best plan costs exactly what estimate(..., calibration) says, not the datasheet model."""
    from flows.plan import plan_flow
    from planner.cost import estimate
    from planner.measure.calibrate import fsdp_overhead_from, measured_slowdowns, pipeline_overhead_s
    from planner.specs.model import get_model
    from storage.hardware import load_snapshot
    from storage.plans import best_plan
    from storage.profiles import load_optimizer_profile, load_profile_table
    from tasks.plan import load_calibration

    db, fingerprint = discovered
    snap = {"fingerprint": fingerprint}
    model = get_model("tiny")
    out = plan_flow(db, "tiny", SearchConfig(global_batch=4, seq=32), snapshot=snap["fingerprint"])
    assert out.feasible and "plan: calibrated to discovery" in capsys.readouterr().out
    calib = load_calibration.fn(db, model, snap["fingerprint"])
    adam = load_optimizer_profile(db, model, "cpu")
    assert calib is not None and (
        calib.adam_s_per_param,
        calib.adam_dtensor_s_per_param,
        calib.adam_fsdp_s_per_param,
    ) == (adam["plain"], adam["tp"], adam["fsdp"])
    # real ranks stepped at once: 2 where this machine has 2 cores (the profile flow's choice)
    assert calib.adam_num_ranks == adam["num_ranks"] == min(2, len(os.sched_getaffinity(0)))
    assert calib.fit("all_reduce") is not None and calib.grad_sync_overlap == 0.0
    # the pipeline schedule's own cost: discovery's trivial 1F1B step less the p2p the model prices
    stored = load_snapshot(db, snap["fingerprint"])
    (pipe,) = stored.measurements.filter(stored.measurements["op"] == "pipeline_microbatch").iter_rows(named=True)
    link = stored.cluster.nodes[0].intra_link
    assert calib.pipeline_overhead_s == pipeline_overhead_s(
        pipe["time_s"], pipe["message_bytes"], link.latency_s, link.bandwidth_bytes_per_s
    )
    # FSDP2's own cost per module, from discovery's bench rows less the collectives' fitted price
    assert calib.fsdp == fsdp_overhead_from(stored.measurements.to_dicts(), dict(calib.collectives))
    # every term non-negative (noise can clamp one to 0), and FSDP2 costs more than its bare
    # collectives on the bench's 16-tensor module, where its per-tensor work dominates (on a 1-tensor
    # module the overhead is within noise of the collectives' fit: CI once measured 0 there)
    assert calib.fsdp is not None and min(calib.fsdp.module_s, calib.fsdp.s_per_byte, calib.fsdp.tensor_s) >= 0
    from worker.netbench import FSDP_TENSORS

    small = min(m["message_bytes"] for m in stored.measurements.to_dicts() if m["op"] == "fsdp_module")
    assert calib.fsdp.op_s(FSDP_TENSORS, small) > 0
    # ranks together against one alone, and in lockstep against free, from discovery's matmul chunks
    ops = set(stored.measurements["op"].to_list())
    assert {"compute_alone", "compute_free", "compute_lockstep"} <= ops
    contention, lockstep = measured_slowdowns(stored.measurements.to_dicts())
    assert (calib.compute_slowdown, calib.lockstep_slowdown) == (contention, lockstep)
    assert contention >= 1.0 and lockstep >= 1.0
    # the node's cores, so ranks that outnumber them are priced as sharing them
    from worker.probe import num_cores

    assert stored.cores_per_node == calib.num_cores == num_cores()
    plan, cluster = best_plan(db, out.search_key), load_snapshot(db, snap["fingerprint"]).cluster
    # CPU ranks train in fp32, the dtype profiled: the plan is priced on measured rows, none estimated
    assert plan.dtype == "fp32" and not any("estimated" in n for n in plan.predicted.notes), plan.predicted.notes
    table = load_profile_table(db, model)
    calibrated = estimate(plan, model, cluster, table, calibration=calib).step_time_s
    assert out.step_time_s == pytest.approx(calibrated, rel=1e-9)
    assert calibrated != pytest.approx(estimate(plan, model, cluster, table).step_time_s, rel=1e-3)


def cli(tmp_path, *args, timeout=300):
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path / "state"), *args]
    env = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


@pytest.mark.dist
def test_meshplan_plan_and_estimate_price_a_discovered_cpu_machine_as_plan_flow_does(discovered, tmp_path):
    """The same snapshot, model and options: `meshplan plan --json` ranks what plan_flow ranks, with the
    same calibration and dtype, and `meshplan estimate` of the best plan prices it with that calibration."""
    from flows.plan import plan_flow
    from planner.specs.plan import parse_plan
    from storage.plans import plans_frame

    db, fingerprint = discovered
    out = plan_flow(db, "tiny", SearchConfig(global_batch=4, seq=32), snapshot=fingerprint)
    best = tmp_path / "best.json"
    args = ("--model", "tiny", "--global-batch", "4", "--seq", "32", "--snapshot", fingerprint, "--json")
    p = cli(tmp_path, "--db", db, "plan", *args, "--out", str(best), "--no-store")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["dtype"] == "fp32" and doc["calibration"]["source"].startswith("discovery: 2 ranks")
    assert doc["calibration"]["collectives"]["all_reduce"]["num_ranks"] == 2
    assert doc["stats"]["complete"] and out.complete
    cli_ranking = [(q.fingerprint(), q.predicted.step_time_s) for q in (parse_plan(d) for d in doc["plans"])]
    frame = plans_frame(db, out.search_key)
    stored = sorted(frame.filter(frame["baseline"] == "").iter_rows(named=True), key=lambda r: r["rank"])
    assert [(r["plan_fingerprint"], r["step_time_s"]) for r in stored] == cli_ranking
    # no --cluster: this machine's newest probe, priced with its calibration as the search priced it
    e = cli(tmp_path, "--db", db, "estimate", "--plan", str(best), "--json")
    assert e.returncode == 0, e.stderr
    est = json.loads(e.stdout)
    assert est["calibration"] == doc["calibration"]
    assert any(n.startswith("calibrated: discovery") for n in est["notes"]), est["notes"]
    assert est["plan"] == out.best_plan_id and est["step_time_s"] == pytest.approx(out.step_time_s, rel=1e-9)
