"""`meshplan serve` under load, a serving rank SIGKILLed mid-load: what the clients got, what was logged.

One real `meshplan serve` (a CPU placement of two one-rank groups: group 0 hosts model a, group 1
model b), N client threads POSTing as fast as they are answered (half to a, half to b, a fresh
connection per request), three phases on the same server:

- `steady`: N clients for --phase-s seconds, nothing killed (the baseline);
- `rank killed`: the same load; group 0's rank is SIGKILLed after 1 s; the phase runs until a is
  served again (the group restarted) and --phase-s more seconds (clients wait the 503's
  Retry-After, 1 s, before their next request);
- `burst`: --burst connections opened at once, one POST each.

Per phase: requests sent, answered (200), refused (an HTTP error reply: 503 while a group is down,
or any 4xx/5xx), lost (no HTTP reply at all: a reset or refused connection, a timeout), and p50 / p99 client latency of the answered ones; for the
kill, the seconds from the kill to the first a answered again. Then the rows of `serve_requests`
against every request that got a reply (a request that got none never reached the router: there is
nothing to log), the readiness probes and the server's warm-ups included.

    PYTHONPATH=. python bench/serve_load.py [--clients 50] [--phase-s 10] [--burst 200]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb

from launcher import group

CLUSTER = """name = "cpu-2"
[[nodes]]
name = "cpu"
device = "cpu"
num_devices = 2
intra_link = "eth-100g"
inter_link = "eth-100g"
device_memory_bytes = 8000000000
device_peak_flop_per_s = 50000000000
"""
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, name: str, backoff: bool = False) -> tuple[str, float]:
    """(answered | refused | lost, seconds); `backoff`: sleep the reply's Retry-After (at most 1 s),
    as a client should while a group restarts."""
    t = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", f"/models/{name}", body=b"{}", headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        took = time.monotonic() - t
        if backoff and r.getheader("Retry-After"):
            time.sleep(min(1.0, float(r.getheader("Retry-After"))))
        return ("answered" if r.status == 200 else "refused"), took
    except (OSError, http.client.HTTPException):
        return "lost", time.monotonic() - t
    finally:
        conn.close()


class Load:
    def __init__(self, port: int, clients: int) -> None:
        self.port, self.stop, self.lock = port, threading.Event(), threading.Lock()
        self.got: list[tuple[float, str, str, float]] = []  # (sent at, model, outcome, seconds)
        self.threads = [threading.Thread(target=self.client, args=("ab"[i % 2],)) for i in range(clients)]

    def client(self, name: str) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            outcome, s = post(self.port, name, backoff=True)
            with self.lock:
                self.got.append((t, name, outcome, s))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)


def rank_pid(state: Path) -> int:
    """Group 0's serving rank: a worker.serve process (not its agent) told --group 0 (the default: no flag)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker.serve" in cmd and b"worker.agent" not in cmd and b"--group" not in cmd:
            if str(state).encode() in b" ".join(cmd):
                return int(d.name)
    raise SystemExit("no serving rank of group 0 found")


def summary(name: str, got: list, logged: int, extra: str = "") -> dict:
    ok = [s for _, _, o, s in got if o == "answered"]
    count = {o: sum(g[2] == o for g in got) for o in ("answered", "refused", "lost")}
    return {
        "phase": name,
        "sent": len(got),
        **count,
        "logged": logged,
        "p50_ms": 1e3 * statistics.median(ok) if ok else float("nan"),
        "p99_ms": 1e3 * sorted(ok)[int(0.99 * (len(ok) - 1))] if ok else float("nan"),
        "note": extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--phase-s", type=float, default=10.0)
    ap.add_argument("--burst", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="serve-load-"))
    (tmp / "cpu.toml").write_text(CLUSTER)
    (tmp / "placement.json").write_text(json.dumps(PLACEMENT))
    port = free_port()
    env = {"PREFECT_HOME": str(tmp / "prefect"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp), "serve", "--placement", str(tmp / "placement.json")]
    cmd += ["--cluster", str(tmp / "cpu.toml"), "--port", str(port), "--serve-s", "600"]
    cpu0 = time.process_time()
    proc = group.start(cmd, extra_env=env, drop_env=("PREFECT_API_URL",), capture=True)  # as a user starts it
    marks: list = []
    probes = 1  # the readiness probe that was answered
    try:
        deadline = time.monotonic() + 300
        while (probe := post(port, "b")[0]) != "answered":
            probes += probe != "lost"  # a reply is a logged request too
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server never came up:\n{proc.stderr.read()[-3000:]}")
            time.sleep(0.5)
        t_start = time.monotonic()
        with Load(port, args.clients) as steady:
            time.sleep(args.phase_s)
        marks.append(("steady", steady.got))
        with Load(port, args.clients) as killed:
            time.sleep(1.0)
            pid = rank_pid(tmp)
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            back = None
            while back is None and time.monotonic() < t_kill + 300:
                time.sleep(0.1)
                with killed.lock:
                    back = next(
                        (t + s for t, n, o, s in killed.got if n == "a" and o == "answered" and t > t_kill), None
                    )
            time.sleep(args.phase_s)
        recovery = f"a served again {back - t_kill:.1f} s after the kill" if back else "a never served again"
        marks.append(("rank killed", killed.got, recovery))
        go, burst = threading.Barrier(args.burst), []

        def one() -> None:
            go.wait()
            t = time.monotonic()
            burst.append((t, "b", *post(port, "b")))

        threads = [threading.Thread(target=one) for _ in range(args.burst)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        marks.append(("burst", burst))
        wall = time.monotonic() - t_start
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the ranks stop, the rows still in memory are written
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
    con = duckdb.connect(str(tmp / "meshplan.duckdb"), read_only=True)
    logged = con.execute("SELECT status, count(*) FROM serve_requests GROUP BY ALL ORDER BY 1").fetchall()
    total = con.execute("SELECT count(*) FROM serve_requests").fetchall()[0][0]
    con.close()
    table = []
    for m in marks:
        name, got = m[0], m[1]
        table.append(summary(name, got, sum(o != "lost" for _, _, o, _ in got), m[2] if len(m) > 2 else ""))
    print(
        f"\n{args.clients} clients, {args.phase_s:.0f} s phases, burst {args.burst}; wall {wall:.0f} s, "
        f"bench CPU {time.process_time() - cpu0:.1f} s"
    )
    print(f"{'phase':<12} {'sent':>6} {'answered':>9} {'refused':>8} {'lost':>5} {'p50 ms':>8} {'p99 ms':>8}  note")
    for r in table:
        print(
            f"{r['phase']:<12} {r['sent']:>6} {r['answered']:>9} {r['refused']:>8} {r['lost']:>5} "
            f"{r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f}  {r['note']}"
        )
    replied = sum(r["answered"] + r["refused"] for r in table)
    warm = 3 * len(PLACEMENT["models"])  # the server's own warm-up requests (3 per model)
    print(
        f"serve_requests rows: {total} {dict(logged)}; requests that got a reply: {replied} + {probes} readiness "
        f"probe(s) + {warm} warm-ups = {replied + probes + warm} ({'all logged' if total == replied + probes + warm else 'MISSING'})"
    )


if __name__ == "__main__":
    main()
