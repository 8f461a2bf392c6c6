"""Serving stays up: the router and its ranks (launcher/router.py, launcher/serving.py, worker/serve.py)
on real torchrun CPU ranks, real HTTP on 127.0.0.1 and a real DuckDB file.

Two groups of one rank each (a hosts model a, b hosts model b). Bad requests are refused before a
rank sees them (too many tokens, a boolean token, an id past the vocabulary), a burst of 200
concurrent POSTs is answered without one connection reset, and a rank SIGKILLed under load costs
only the requests on its group: they are answered 503 while its group is down, b is served
throughout, a is served again once its group restarted, and every request the clients sent is a
row of serve_requests.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from pathlib import Path

import duckdb
import pytest

import rundir
from launcher.group import job_processes
from launcher.router import Router
from launcher.serving import Serving
from planner.serve.placement import Placement
from storage.serve import record_requests

pytestmark = pytest.mark.dist

DIMS = {"num_layers": 2, "hidden": 64, "num_heads": 4, "vocab_size": 256, "seq_len": 32}
PLACEMENT = {
    "method": "manual",
    "cluster": "cpu-2",
    "dtype": "fp32",
    "models": [{"name": n, "dims": {"name": n, **DIMS}, "seq": 16, "slo_s": 60.0} for n in ("a", "b")],
    "groups": [
        {"devices": [0], "kind": "cpu", "pp": 1, "tp": 1, "models": ["a"]},
        {"devices": [1], "kind": "cpu", "pp": 1, "tp": 1, "models": ["b"]},
    ],
}


def _post(port: int, name: str, body: bytes = b"{}") -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", f"/models/{name}", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def _rank_pid(proc) -> int:
    """The serving rank (not the torchrun agent) of a one-rank group's process group."""
    for pid in job_processes(proc.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker.serve" in cmd and b"worker.agent" not in cmd:
            return pid
    raise AssertionError("no serving rank found")


def test_bad_requests_a_burst_and_a_rank_killed_under_load_leave_the_server_up_and_every_request_logged(
    tmp_path,
) -> None:
    pl = Placement.model_validate(PLACEMENT)
    run_dir = str(tmp_path / "run")
    rundir.serve_placement_path(run_dir).parent.mkdir(parents=True)
    rundir.serve_placement_path(run_dir).write_text(pl.model_dump_json())
    router = Router(pl, {"a": 60.0, "b": 60.0}, "r1")
    ranks = Serving(pl, router, run_dir, options={"calib_reps": 2})
    sent: list[tuple[str, int]] = []  # (model, status) of every request that reached a model's route
    try:
        ranks.start(120)
        port = router.start_http(0)
        # checked against the model before any rank: seq_len 32, vocab 256
        for body in (json.dumps({"tokens": [1] * 33}), '{"tokens": [true]}', '{"tokens": [256]}', '{"x": 1}'):
            code, reply = _post(port, "a", body.encode())
            assert code == 400 and reply["error"], (body, reply)
        assert "seq_len is 32" in _post(port, "a", json.dumps({"tokens": [1] * 33}).encode())[1]["error"]
        code, reply = _post(port, "a", json.dumps({"tokens": [3] * 32}).encode())
        assert code == 200 and isinstance(reply["token"], int), reply  # the server still answers
        sent.append(("a", 200))

        # a burst: 200 connections at once, none reset (the listen backlog holds them)
        go, results = threading.Barrier(200), []

        def one() -> None:
            go.wait()
            try:
                results.append(_post(port, "b")[0])
            except OSError as exc:
                results.append(type(exc).__name__)

        burst = [threading.Thread(target=one) for _ in range(200)]
        for t in burst:
            t.start()
        for t in burst:
            t.join(120)
        assert sorted(map(str, results)) == ["200"] * 200, {str(r) for r in results}
        sent += [("b", 200)] * 200

        # 4 clients under load, group 0's rank SIGKILLed
        stop, lock = threading.Event(), threading.Lock()

        def client(name: str) -> None:
            while not stop.is_set():
                code, _ = _post(port, name)
                with lock:
                    sent.append((name, code))
                time.sleep(0.05)  # a steady load that leaves the two cores to the restarting ranks

        load = [threading.Thread(target=client, args=(n,)) for n in ("a", "b") * 2]
        for t in load:
            t.start()
        time.sleep(1.0)
        before = len(sent)
        os.kill(_rank_pid(ranks.procs[0]), signal.SIGKILL)
        deadline = time.monotonic() + 90
        while not any(n == "a" and c == 200 for n, c in sent[before + 20 :]) or not ranks.router.up[0]:
            assert time.monotonic() < deadline, "group 0 never served again"
            time.sleep(0.2)
        time.sleep(0.5)
        stop.set()
        for t in load:
            t.join(60)
        after_kill = sent[before:]
        assert any(n == "a" and c == 503 for n, c in after_kill), "no request failed while group 0 was down"
        assert all(c == 200 for n, c in after_kill if n == "b"), "group 1 stopped serving"
        assert [e.event for e in ranks.events if e.group == 0][:2] == ["died", "restarted"], ranks.events
        assert not [e for e in ranks.events if e.group == 1]
    finally:
        router.stop_http()
        codes = ranks.stop(30)
        router.close()
    assert codes == [0, 0]  # both groups' last generation ended cleanly (exit_now)
    db = tmp_path / "meshplan.duckdb"
    record_requests(db, router.take_rows())
    con = duckdb.connect(str(db), read_only=True)
    got = dict(con.execute("SELECT status, count(*) FROM serve_requests GROUP BY ALL").fetchall())
    total = con.execute("SELECT count(*) FROM serve_requests").fetchall()[0][0]
    con.close()
    assert total == len(sent), (total, len(sent))  # every request: answered, failed or refused
    assert got.get("ok") == sum(c == 200 for _, c in sent)
    assert got.get("failed", 0) + got.get("refused", 0) == sum(c == 503 for _, c in sent) > 0
