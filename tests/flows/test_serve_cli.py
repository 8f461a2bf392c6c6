"""`meshplan serve-plan`, `serve-simulate` and `serve`: real CLI processes, real ranks, real HTTP, DuckDB."""

import json
import re
import socket
import sys
import time
import urllib.error
import urllib.request

import duckdb
import pytest

from launcher import group
from planner.serve.workload import ServedModel, Workload, make_trace
from tests.support import procs
from tests.support.cli import meshplan, session_prefect_api

CPU2 = """name = "cpu-2"
[[nodes]]
name = "cpu"
device = "cpu"
num_devices = 2
intra_link = "eth-100g"
inter_link = "eth-100g"
device_memory_bytes = 8000000000
device_peak_flop_per_s = 50000000000
"""
MIXED = "examples/clusters/mixed-a100-v100-t4.toml"
WORKLOAD = """name = "four"
duration_s = 20
[[models]]
name = "small"
preset = "gpt2-small"
seq = 512
rate = 6
cv = 3
slo_scale = 5
[[models]]
name = "medium"
preset = "gpt2-medium"
seq = 512
rate = 4
cv = 3
slo_scale = 5
[[models]]
name = "large"
preset = "gpt3-1.3b"
seq = 512
rate = 3
cv = 3
slo_scale = 5
"""


def _models() -> list[dict]:
    dims = {"num_layers": 4, "num_heads": 4, "vocab_size": 512, "seq_len": 128}
    return [
        {"name": "a", "dims": {"name": "a", "hidden": 256, **dims}, "rate": 5, "cv": 2, "slo_s": 5.0},
        {"name": "b", "dims": {"name": "b", "hidden": 192, **dims}, "rate": 5, "cv": 2, "slo_s": 5.0},
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_serve_replays_a_gamma_trace_on_a_two_stage_pipeline_like_the_simulator(tmp_path) -> None:
    """Two models on one 2-rank pipeline group serve a replayed Gamma trace; the simulator, calibrated
    with the ranks' per-request service figures, predicts p50 within 25 % and p99 within 40 % (below);
    every request is in DuckDB;
    unknown models get 404 with the served list, malformed bodies 400; only 127.0.0.1 listens."""
    (tmp_path / "cpu.toml").write_text(CPU2)
    placement = {
        "method": "manual",
        "cluster": "cpu-2",
        "dtype": "fp32",
        "models": _models(),
        "groups": [{"devices": [0, 1], "kind": "cpu", "pp": 2, "tp": 1, "models": ["a", "b"]}],
    }
    (tmp_path / "placement.json").write_text(json.dumps(placement))
    models = tuple(ServedModel.model_validate(m) for m in _models())
    trace = make_trace(Workload(models=models, duration_s=16, seed=3))
    (tmp_path / "trace.csv").write_text(trace.to_csv(["a", "b"]))
    port = _free_port()
    env_cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path), "serve"]
    args = ["--placement", str(tmp_path / "placement.json"), "--cluster", str(tmp_path / "cpu.toml")]
    args += ["--replay", str(tmp_path / "trace.csv"), "--port", str(port)]
    import os

    # the serve flow reports to the session's Prefect server (PREFECT_API_URL): no temporary server to start
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"), OMP_NUM_THREADS="1")
    env["PREFECT_API_URL"] = session_prefect_api()
    proc = procs.start([*env_cmd, *args], env=env, capture=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(base + "/models", timeout=5) as r:
                    assert json.loads(r.read()) == {"served": ["a", "b"]}
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, "the server never came up"
                time.sleep(0.3)
        code, body = _post(base + "/models/nope", b"{}")
        assert code == 404 and body["served"] == ["a", "b"]
        code, body = _post(base + "/models/a", b"{not json")
        assert code == 400 and "tokens" in body["error"]
        code, _ = _post(base + "/models/a", b'{"tokens": [1, 99999]}')
        assert code == 400
        # checked against the model before a rank sees it (seq_len 128; a bool is not a token id);
        # the replay below is answered by the same server
        code, body = _post(base + "/models/a", json.dumps({"tokens": [1] * 129}).encode())
        assert code == 400 and "seq_len is 128" in body["error"], body
        code, body = _post(base + "/models/a", b'{"tokens": [true]}')
        assert code == 400 and "tokens[0]" in body["error"], body
        outside = socket.gethostbyname(socket.gethostname())
        if not outside.startswith("127."):
            with socket.socket() as s:
                s.settimeout(2)
                assert s.connect_ex((outside, port)) != 0
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    row = next(ln for ln in out.splitlines() if ln.startswith("all "))
    p50m, p50s, p99m, p99s = (float(x) for x in re.findall(r"([\d.]+)ms", row))
    # the simulator, calibrated with the ranks' and router's per-request service figures (never a
    # request's latency or wait), against the measured latencies. p50: the 25 % (19 runs on
    # this shared 2-core box: within 8 %). p99 of ~160 requests is the last few of the one or two
    # largest bursts, 3-4 requests deep: a sum of few service times that share the box's state in
    # that instant, so one replay's p99 itself varies ±15-20 % (the simulator's 15 seeds spread as
    # much); 19 runs: within 30 %, 16 of 19 within 25 %, so the bound is 40 %. A longer trace would
    # steady p99 but costs CI time.
    assert abs(p50s / p50m - 1) <= 0.25, row
    assert abs(p99s / p99m - 1) <= 0.40, row
    con = duckdb.connect(str(tmp_path / "meshplan.duckdb"), read_only=True)
    served = con.execute(
        "SELECT count(*), count(latency_s), min(status), max(status) FROM serve_requests WHERE phase = 'serve'"
    ).fetchall()
    warm = con.execute("SELECT count(*) FROM serve_requests WHERE phase = 'warmup'").fetchall()[0][0]
    # the run's serving figures, fitted on its per-request logs, stored for the next serve-plan
    fitted = con.execute("SELECT device_kind, front_s, reply_s, handoff_s, requests FROM serve_calibrations").fetchall()
    con.close()
    assert served[0] == (len(trace), len(trace), "ok", "ok")
    assert warm == 6
    assert len(fitted) == 1 and fitted[0][0] == "cpu" and 0 < fitted[0][4] <= len(trace), fitted
    assert all(0 < x < 1.0 for x in fitted[0][1:4]), fitted  # front end, reply, hand-off: measured, sub-second


def test_serve_plan_compares_placements_and_bad_input_is_one_line(tmp_path) -> None:
    w = tmp_path / "workload.toml"
    w.write_text(WORKLOAD)
    out = tmp_path / "placement.json"
    # an earlier serving run's figures for the T4s (as the serve flow stores them): serve-plan's cost model takes them
    from planner.serve.cost import KindServing
    from storage.serve import save_serving

    save_serving(
        tmp_path / "meshplan.duckdb", "serve-earlier", {"T4": KindServing(0.004, 0.001, 0.002, 0.3)}, {"T4": 40}
    )
    p = meshplan(tmp_path, "serve-plan", "--workload", str(w), "--cluster", MIXED, "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "serving figures for T4 (fitted on 1 serving run(s), 40 requests): front end 4.00 ms" in p.stdout, p.stdout
    assert re.search(r"\| meshplan \| [\d.]+ % \|", p.stdout) and "| selective-replication |" in p.stdout
    assert "--tensor-parallel-size" in p.stdout and "--pipeline-parallel-size" in p.stdout
    pl = json.loads(out.read_text())
    assert {m for g in pl["groups"] for m in g["models"]} == {"small", "medium", "large"}
    p = meshplan(tmp_path, "serve-simulate", "--placement", str(out), "--cluster", MIXED, "--duration-s", "10")
    assert p.returncode == 0, p.stderr
    assert re.search(r"^all\s+\d+\s+[\d.]+%", p.stdout, re.M)
    pl["groups"][0]["models"] = ["large", "medium", "small"]
    big = {"large": "gpt3-13b", "medium": "gpt3-6.7b"}  # 26 + 13.4 GB of fp16 weights on one 40 GB A100
    pl["models"] = [dict(m, preset=big.get(m["name"], m["preset"])) for m in pl["models"]]
    pl["groups"][0] = dict(pl["groups"][0], devices=[pl["groups"][0]["devices"][0]], pp=1, tp=1)
    over = tmp_path / "over.json"
    over.write_text(json.dumps(pl))
    p = meshplan(tmp_path, "serve-simulate", "--placement", str(over), "--cluster", MIXED)
    assert p.returncode == 1 and "weights need" in p.stderr and "host fewer models" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_serve_runs_a_tensor_parallel_group_and_answers_what_one_process_computes(tmp_path) -> None:
    """One model on a pp = 1 × tp = 2 group (two ranks splitting heads, MLP, embedding and head)
    serves a replayed trace through `meshplan serve`; every request is recorded, and a request with
    given tokens gets the next token a single-process forward of the same weights gives."""
    import os

    import torch

    from worker.model import Decoder, init_weights

    (tmp_path / "cpu.toml").write_text(CPU2)
    model = dict(_models()[1], rate=4)
    placement = {
        "method": "manual",
        "cluster": "cpu-2",
        "dtype": "fp32",
        "models": [model],
        "groups": [{"devices": [0, 1], "kind": "cpu", "pp": 1, "tp": 2, "models": ["b"]}],
    }
    (tmp_path / "placement.json").write_text(json.dumps(placement))
    from cli.commands.serve import vllm_args
    from planner.serve.placement import Placement

    assert "--tensor-parallel-size 2 --pipeline-parallel-size 1" in vllm_args(Placement.model_validate(placement))[0]
    sm = ServedModel.model_validate(model)
    trace = make_trace(Workload(models=(sm,), duration_s=2, seed=5))
    (tmp_path / "trace.csv").write_text(trace.to_csv(["b"]))
    port = _free_port()
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path), "serve"]
    cmd += ["--placement", str(tmp_path / "placement.json"), "--cluster", str(tmp_path / "cpu.toml")]
    cmd += ["--replay", str(tmp_path / "trace.csv"), "--port", str(port)]
    # the serve flow reports to the session's Prefect server (PREFECT_API_URL): no temporary server to start
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"), OMP_NUM_THREADS="1")
    env["PREFECT_API_URL"] = session_prefect_api()
    tokens = [(7 * i + 3) % sm.spec.vocab_size for i in range(sm.tokens)]
    whole = Decoder(sm.spec)
    init_weights(whole, 0, sm.spec.num_layers)
    with torch.no_grad():
        want = int(whole.eval()(torch.tensor([tokens]))[0, -1].argmax())
    proc = procs.start(cmd, env=env, capture=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                code, body = _post(f"http://127.0.0.1:{port}/models/b", json.dumps({"tokens": tokens}).encode())
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, "the server never came up"
                time.sleep(0.3)
        assert code == 200 and body["token"] == want, body
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    con = duckdb.connect(str(tmp_path / "meshplan.duckdb"), read_only=True)
    rows = con.execute("SELECT phase, status, latency_s IS NOT NULL FROM serve_requests").fetchall()
    con.close()
    # the trace, 3 warm-ups and the request above, all served (it may land in either phase)
    assert len(rows) == len(trace) + 3 + 1 and {r[1:] for r in rows} == {("ok", True)}
    assert sum(r[0] == "serve" for r in rows) >= len(trace)
    calib = sorted(p.name for p in (tmp_path / "runs").glob("*/calib_rank*.json"))
    assert calib == ["calib_rank0.json"]  # one calibration file per stage: its tp rank 0's


def test_serve_mixes_a_tp1_and_a_tp2_group_and_drops_at_the_tp_lead(tmp_path) -> None:
    """One placement, two groups of different sizes: group 0 = 1 rank (tp = 1) hosting a, group 1 =
    2 ranks (tp = 2) hosting b and c. b's SLO (0.1 ms) is below any forward, so its lead drops every
    b request: answered 503, recorded 'dropped' in DuckDB, counted per model and per group, and never
    sent to the tp peer. b's drops interleave with c's served requests on the same tp ranks: a dropped
    request that reached the peer would pair its collectives with the wrong request and hang or
    answer wrongly; c and a must answer what a single-process forward of the same weights gives."""
    import os
    import signal

    import torch

    from worker.model import Decoder, init_weights

    (tmp_path / "cpu.toml").write_text(CPU2.replace("cpu-2", "cpu-3").replace("num_devices = 2", "num_devices = 3"))
    dims = {"num_layers": 2, "hidden": 64, "num_heads": 4, "vocab_size": 256, "seq_len": 32}
    models = [
        {"name": n, "dims": {"name": n, **dims}, "seq": 16, "rate": 4, "cv": 1, "slo_s": slo}
        for n, slo in (("a", 5.0), ("b", 1e-4), ("c", 5.0))
    ]
    placement = {
        "method": "manual",
        "cluster": "cpu-3",
        "dtype": "fp32",
        "models": models,
        "groups": [
            {"devices": [0], "kind": "cpu", "pp": 1, "tp": 1, "models": ["a"]},
            {"devices": [1, 2], "kind": "cpu", "pp": 1, "tp": 2, "models": ["b", "c"]},
        ],
    }
    (tmp_path / "placement.json").write_text(json.dumps(placement))
    served = tuple(ServedModel.model_validate(m) for m in models)
    trace = make_trace(Workload(models=served, duration_s=3, seed=7))
    names = [m["name"] for m in models]
    per_model = {n: int(sum(names[m] == n for m in trace.model.tolist())) for n in names}
    assert min(per_model.values()) >= 3, per_model
    (tmp_path / "trace.csv").write_text(trace.to_csv(names))
    port = _free_port()
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path), "serve"]
    cmd += ["--placement", str(tmp_path / "placement.json"), "--cluster", str(tmp_path / "cpu.toml")]
    cmd += ["--replay", str(tmp_path / "trace.csv"), "--port", str(port)]
    # the serve flow reports to the session's Prefect server (PREFECT_API_URL): no temporary server to start
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"), OMP_NUM_THREADS="1")
    env["PREFECT_API_URL"] = session_prefect_api()
    tokens = [(5 * i + 2) % 256 for i in range(16)]
    want = {}
    for n in ("a", "c"):
        whole = Decoder(served[names.index(n)].spec)
        init_weights(whole, 0, 2)
        with torch.no_grad():
            want[n] = int(whole.eval()(torch.tensor([tokens]))[0, -1].argmax())
    # its own session: a failing check kills the CLI with the Prefect server it started (which holds
    # the output pipes), so the test fails instead of waiting on them
    proc = procs.start(cmd, env=env, capture=True)
    base = f"http://127.0.0.1:{port}/models/"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                code, body = _post(base + "b", json.dumps({"tokens": tokens}).encode())
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, "the server never came up"
                time.sleep(0.3)
        assert code == 503 and body["status"] == "dropped", body
        for n in ("c", "a"):
            code, body = _post(base + n, json.dumps({"tokens": tokens}).encode())
            assert code == 200 and body["token"] == want[n], (n, body)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            group.send(proc, signal.SIGKILL)
            proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    con = duckdb.connect(str(tmp_path / "meshplan.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT model, grp, status, count(*), count(latency_s) FROM serve_requests WHERE phase = 'serve' "
        "GROUP BY ALL ORDER BY model"
    ).fetchall()
    total = con.execute("SELECT count(*) FROM serve_requests").fetchall()[0][0]
    con.close()
    # every request recorded: the trace, 3 warm-ups per model and the 3 above (in either phase)
    assert total == len(trace) + 3 * 3 + 3
    got = {r[0]: r[1:] for r in rows}
    assert set(got) == {"a", "b", "c"}, rows
    assert got["a"][:2] == (0, "ok") and got["a"][2] == got["a"][3] >= per_model["a"]
    assert got["b"][:2] == (1, "dropped") and got["b"][2] >= per_model["b"] and got["b"][3] == 0
    assert got["c"][:2] == (1, "ok") and got["c"][2] == got["c"][3] >= per_model["c"]
    # per-group results: group 1 served c and dropped every b
    g1 = re.search(r"^group 1 .*$", out, re.M)
    assert g1 and "1 × 2" in g1.group() and f"dropped {got['b'][2]} p50" in g1.group(), out
    g0 = re.search(r"^group 0 .*$", out, re.M)
    assert g0 and "1 × 1" in g0.group() and "dropped 0 p50" in g0.group(), out
    run = next((tmp_path / "runs").iterdir())
    assert sorted(p.name for p in run.glob("calib_rank*.json")) == ["calib_rank0.json", "calib_rank1.json"]
    logs = {p.name: json.loads(p.read_text()) for p in run.glob("stage_rank*.json")}
    assert set(logs) == {"stage_rank0.json", "stage_rank1.json"}  # tp rank 0 of each stage
    assert {e["model"] for e in logs["stage_rank1.json"]["requests"]} == {"c"}  # b never ran
    assert logs["stage_rank1.json"]["group"] == 1
    # the simulator's calibration, keyed (device kind, model, pp, tp, batch) from tp rank 0's files: c from the
    # requests it served, b (every one dropped) from the start-up timing
    from planner.serve.placement import Placement
    from tasks.serve import read_calibration

    calib = read_calibration(run, Placement.model_validate(placement))
    assert set(calib) == {("cpu", "a", 1, 1, 1), ("cpu", "b", 1, 2, 1), ("cpu", "c", 1, 2, 1)}
    c_served = [e["compute_s"] for e in logs["stage_rank1.json"]["requests"]]
    assert calib[("cpu", "c", 1, 2, 1)] == (pytest.approx(sum(c_served) / len(c_served)),)
    assert calib[("cpu", "b", 1, 2, 1)] == (json.loads((run / "calib_rank1.json").read_text())["stage_s"]["b"],)


def test_serve_refuses_a_port_in_use_and_a_placement_made_for_another_cluster_in_one_line(tmp_path) -> None:
    (tmp_path / "cpu.toml").write_text(CPU2)
    placement = {
        "method": "manual",
        "cluster": "mixed",
        "dtype": "fp32",
        "models": _models(),
        "groups": [{"devices": [0, 1], "kind": "a100-40gb", "pp": 2, "tp": 1, "models": ["a", "b"]}],
    }
    (tmp_path / "placement.json").write_text(json.dumps(placement))
    args = ["--placement", str(tmp_path / "placement.json"), "--cluster", str(tmp_path / "cpu.toml")]
    for cmd in (["serve-simulate", *args], ["serve", *args, "--port", "0"]):
        p = meshplan(tmp_path, *cmd)
        assert p.returncode == 1 and "groups[0].kind" in p.stderr and "serve-plan" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    placement["groups"][0]["kind"] = "cpu"
    (tmp_path / "placement.json").write_text(json.dumps(placement))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = meshplan(tmp_path, "serve", *args, "--port", str(port))
    assert p.returncode == 1 and "--port" in p.stderr and str(port) in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written
