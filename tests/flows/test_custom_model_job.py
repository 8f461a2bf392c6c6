"""A job whose model is given by its dimensions (`meshplan submit --model custom ...`), end to end.

Submitted through the real CLI, its ModelSpec is stored with the job (migration 0012); a real
scheduler_flow round prices it with the planner's search on those dimensions, admits it on the
2-rank CPU cluster and starts its runner (flows/job.py, its own process), whose train_flow launches
2 gloo ranks that build the custom model from the run folder's model.json. The job finishes, and
its final weights equal a single-process reference of the same custom model (SGD: a wrong model,
a lost or repeated step would show).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from flows.scheduler import scheduler_flow
from launcher import group
from planner.specs.config import TrainConfig
from planner.specs.model import ModelSpec
from storage.jobs import get_job, job_events, job_model
from tests.flows.test_elastic_job import rank0_rows, wait_until
from tests.support.cli import meshplan, session_prefect_api
from tests.worker.test_train_dist import assert_matches_reference

pytestmark = [pytest.mark.dist, pytest.mark.flow]

CLUSTER = "tests/data/cpu-2ranks.toml"
DIMS = ["--layers", "2", "--hidden", "32", "--heads", "2", "--vocab", "128", "--seq-len", "32", "--family", "llama"]
SPEC = ModelSpec(name="custom", family="llama", num_layers=2, hidden=32, num_heads=2, vocab_size=128, seq_len=32)
STEPS, LR = 8, 0.1
TRAIN = ["--data", "synthetic", "--optimizer", "sgd", "--lr", str(LR), "--checkpoint-every", "1000"]


def test_custom_model_job_is_priced_trained_on_two_ranks_and_matches_one_process(tmp_path):
    db, runs = str(tmp_path / "meshplan.duckdb"), tmp_path / "runs"
    args = ["submit", "--model", "custom", *DIMS, "--global-batch", "4", "--iterations", str(STEPS), *TRAIN]
    p = meshplan(tmp_path, *args, "--job-id", "c")
    assert p.returncode == 0 and p.stdout.strip() == "c", p.stderr
    row = get_job(db, "c")
    assert row["model"] == "custom" and job_model(row) == SPEC  # the dimensions, not a preset name

    pid = None
    try:
        out = scheduler_flow(db, CLUSTER, "jct", runs_dir=str(runs), train=TrainConfig(timeout_s=300.0))
        assert out.actions == [("c", "start", "2xcpu/1")], out  # priced on the custom dims: 2 ranks beat 1
        pid = out.applied[0]["runner_pid"]
        wait_until(lambda: get_job(db, "c")["state"] in ("finished", "failed"), "job c to end", 240.0)
    finally:  # a failed assertion must not leave the runner (and its ranks) behind
        if pid:
            group.send(pid, signal.SIGTERM)
    run_dir = runs / "c"
    log = (run_dir / "job.log").read_text()[-3000:] if (run_dir / "job.log").is_file() else ""
    assert get_job(db, "c")["state"] == "finished", log
    assert [e["to_state"] for e in job_events(db, "c").to_dicts()] == ["queued", "running", "finished"]
    plan = json.loads((run_dir / "plans" / "segment_0.json").read_text())
    assert plan["model"] == "custom" and plan["provenance"]["model_fingerprint"] == SPEC.fingerprint()
    assert ModelSpec.model_validate_json((run_dir / "model.json").read_text()) == SPEC  # what the ranks built
    rows = rank0_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS)) and {r["dp"] for r in rows} == {2}
    assert_matches_reference(run_dir, SPEC, STEPS, lr=LR)


def test_submit_refuses_bad_dimensions_naming_the_option(tmp_path):
    base = ["submit", "--global-batch", "4", "--iterations", "2", "--model", "custom"]
    p = meshplan(tmp_path, *base, "--layers", "2", "--hidden", "30", "--heads", "4")
    assert p.returncode == 1 and p.stderr.startswith("error: --hidden=30") and "divisible" in p.stderr, p.stderr
    p = meshplan(tmp_path, *base, "--hidden", "32", "--heads", "2")
    assert p.returncode == 1 and p.stderr.startswith("error: --layers") and "required" in p.stderr, p.stderr
    p = meshplan(tmp_path, *base, "--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads", "3")
    assert p.returncode == 1 and p.stderr.startswith("error: --kv-heads=3"), p.stderr
    p = meshplan(tmp_path, *base, *DIMS[:-2], "--seq", "64")  # gpt's learned positions end at --seq-len 32
    assert p.returncode == 1 and p.stderr.startswith("error: --seq=64") and "<= that" in p.stderr, p.stderr
    p = meshplan(tmp_path, "submit", "--global-batch", "4", "--iterations", "2", "--layers", "2")
    assert p.returncode == 1 and "pass --model custom" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert meshplan(tmp_path, "jobs").stdout.strip() == "no jobs"  # nothing refused was queued


def test_train_request_builds_the_plans_model_only_from_its_own_dimensions(tmp_path):
    """train_flow's model check (request_model): a custom model's plan needs its dimensions, and
    other dimensions than those the plan was searched for are refused before any rank starts."""
    from flows.requests import TrainRequest
    from flows.train import request_model
    from planner.errors import MeshplanError
    from planner.search import search
    from planner.specs.cluster import parse_cluster_toml
    from planner.specs.runspec import RunSpec

    cluster = parse_cluster_toml(Path(CLUSTER).read_text(), CLUSTER)
    plan = search(SPEC, cluster, global_batch=4, top_k=1, time_budget_s=5.0, baselines=False).best
    same, other = tmp_path / "same.json", tmp_path / "other.json"
    same.write_text(SPEC.model_dump_json())
    other.write_text(SPEC.model_copy(update={"num_layers": 3}).model_dump_json())
    assert request_model(TrainRequest(plan_path="p.json", spec=RunSpec(model_json=str(same))), plan) == SPEC
    with pytest.raises(MeshplanError, match="not the plan's model's") as exc:
        request_model(TrainRequest(plan_path="p.json", spec=RunSpec(model_json=str(other))), plan)
    assert exc.value.field == "model_json"
    with pytest.raises(MeshplanError, match="custom model"):
        request_model(TrainRequest(plan_path="p.json"), plan)  # no preset is named "custom"


def test_submit_reads_a_model_toml_and_a_plan_of_a_file_named_like_a_preset_is_not_that_preset(tmp_path):
    from cli.commands.model_options import model_for_plan
    from planner.errors import MeshplanError
    from planner.search import search
    from planner.specs.cluster import parse_cluster_toml
    from planner.specs.model import PRESETS

    toml = tmp_path / "tiny.toml"  # named like the preset, other dimensions
    toml.write_text('family = "gpt"\nnum_layers = 3\nhidden = 32\nnum_heads = 2\nvocab_size = 128\nseq_len = 32\n')
    p = meshplan(tmp_path, "submit", "--model", str(toml), "--global-batch", "4", "--iterations", "2", "--job-id", "f")
    assert p.returncode == 0, p.stderr
    spec = job_model(get_job(tmp_path / "meshplan.duckdb", "f"))
    assert spec is not None and (spec.name, spec.num_layers) == ("tiny", 3) and spec != PRESETS["tiny"]
    cluster = parse_cluster_toml(Path(CLUSTER).read_text(), CLUSTER)
    plan = search(spec, cluster, global_batch=4, top_k=1, time_budget_s=5.0, baselines=False).best
    assert plan.model == "tiny"
    with pytest.raises(MeshplanError, match="custom model"):
        model_for_plan(plan, None)  # the preset `tiny` is not the model this plan was priced for
    assert model_for_plan(plan, spec) == spec


def test_meshplan_train_trains_a_custom_models_plan_given_its_dimensions(tmp_path):
    from planner.search import search
    from planner.specs.cluster import parse_cluster_toml

    cluster = parse_cluster_toml(Path(CLUSTER).read_text(), CLUSTER)
    plan = search(SPEC, cluster, global_batch=4, top_k=1, time_budget_s=5.0, baselines=False).best
    (tmp_path / "p.json").write_text(plan.to_json())
    base = ["train", "--plan", str(tmp_path / "p.json"), "--steps", "2", "--data", "synthetic", "--no-replan"]
    p = meshplan(tmp_path, *base)
    assert p.returncode == 1 and "custom model" in p.stderr and "--model custom" in p.stderr, p.stderr
    wrong = [*DIMS[:1], "3", *DIMS[2:]]  # 3 layers: not the plan's model
    p = meshplan(tmp_path, *base, "--model", "custom", *wrong)
    assert p.returncode == 1 and p.stderr.startswith("error: --model") and "fingerprint" in p.stderr, p.stderr
    p = meshplan(tmp_path, *base, "--model", "custom", *DIMS, "--json", prefect_api_url=session_prefect_api())
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout[p.stdout.index("{") :])
    assert out["status"] == "completed" and len(out["losses"]) == 2
    built = ModelSpec.model_validate_json((tmp_path / "models" / f"{SPEC.fingerprint()}.json").read_text())
    assert built == SPEC
