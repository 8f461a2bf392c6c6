"""The request front end of `meshplan serve`: HTTP on 127.0.0.1, one route per model, ranks behind it.

`POST /models/<name>` (JSON body, optional `{"tokens": [ints]}`) is timed from arrival to reply:
the router sends the request, with its deadline (arrival + the model's SLO), to the first stage of
the group hosting the model (the least busy, when several do) over that rank's TCP connection, and
answers when the group's last stage reports it done (200, with the next token: the argmax of the
last position's logits of the first sequence) or its first stage dropped it because it
could not meet its SLO (503). An unknown model gets 404 with the served models listed, a malformed
request 400. `GET /models` lists them. Every request becomes a row for `serve_requests` (DuckDB,
written by the caller: ranks and HTTP threads never hold the database).
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from planner.serve.placement import Placement

LOOPBACK = "127.0.0.1"


class _Pending:
    __slots__ = ("event", "status", "group", "token")

    def __init__(self, group: int) -> None:
        self.event = threading.Event()
        self.status = "failed"
        self.group = group
        self.token: int | None = None


class Router:
    """Rank connections, routing and the request log (module docstring)."""

    def __init__(self, pl: Placement, slo_s: dict[str, float], run_id: str, request_timeout_s: float = 60.0) -> None:
        self.pl, self.slo_s, self.run_id = pl, slo_s, run_id
        self.timeout_s = request_timeout_s
        self.hosts = {m.name: [i for i, g in enumerate(pl.groups) if m.name in g.models] for m in pl.models}
        self.served = sorted(n for n, gs in self.hosts.items() if gs)
        self.vocab = {m.name: m.spec.vocab_size for m in pl.models}
        self.lead: dict[int, socket.socket] = {}
        self.lead_lock = {i: threading.Lock() for i in range(len(pl.groups))}
        self.outstanding = [0] * len(pl.groups)
        self.pending: dict[int, _Pending] = {}
        self.rows: list[dict] = []
        self.lock = threading.Lock()
        self.ids = itertools.count()
        self.t0 = time.monotonic()
        self.ranks = socket.create_server((LOOPBACK, 0))
        self.http: ThreadingHTTPServer | None = None
        self.phase = "serve"

    @property
    def rank_address(self) -> str:
        return f"{LOOPBACK}:{self.ranks.getsockname()[1]}"

    def accept_ranks(self, timeout_s: float, alive=lambda: True) -> None:
        """Wait until every group's first and last stage connected (`alive()` False: the ranks died)."""
        need = {(i, r) for i in range(len(self.pl.groups)) for r in ("lead", "done")}
        self.ranks.settimeout(0.5)
        deadline = time.monotonic() + timeout_s
        while need:
            if time.monotonic() > deadline or not alive():
                raise TimeoutError(f"serving ranks did not all connect within {timeout_s:.0f} s")
            try:
                conn, _ = self.ranks.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            reader = conn.makefile("r")
            hello = json.loads(reader.readline())
            key = (int(hello["group"]), hello["role"])
            need.discard(key)
            if hello["role"] == "lead":
                self.lead[key[0]] = conn
            threading.Thread(target=self._replies, args=(reader,), daemon=True).start()

    def _replies(self, reader) -> None:
        for line in reader:
            msg = json.loads(line)
            with self.lock:
                p = self.pending.get(int(msg["id"]))
            if p is not None:
                p.status = msg["status"]
                p.token = msg.get("token")
                p.event.set()

    def handle(self, name: str, body: bytes) -> tuple[int, dict]:
        """One request: (HTTP status, JSON reply)."""
        arrival = time.monotonic()
        if name not in self.hosts or not self.hosts[name]:
            return 404, {"error": f"model {name!r} is not served", "served": self.served}
        try:
            req = json.loads(body or b"{}")
            tokens = req.get("tokens") if isinstance(req, dict) else None
            if not isinstance(req, dict) or (
                tokens is not None
                and (
                    not isinstance(tokens, list)
                    or not tokens
                    or not all(isinstance(t, int) and 0 <= t < self.vocab[name] for t in tokens)
                )
            ):
                raise ValueError
        except ValueError:
            return 400, {"error": f'body must be JSON, optionally {{"tokens": [ints in 0..{self.vocab[name] - 1}]}}'}
        rid = next(self.ids)
        with self.lock:
            gi = min(self.hosts[name], key=lambda g: self.outstanding[g])
            self.outstanding[gi] += 1
            p = self.pending[rid] = _Pending(gi)
        msg = {"id": rid, "model": name, "deadline": arrival + self.slo_s[name]}
        if tokens is not None:
            msg["tokens"] = tokens
        with self.lead_lock[gi]:
            self.lead[gi].sendall((json.dumps(msg) + "\n").encode())
        p.event.wait(self.timeout_s)
        finish = time.monotonic()
        latency = finish - arrival
        with self.lock:
            self.outstanding[gi] -= 1
            del self.pending[rid]
            self.rows.append(
                {
                    "run_id": self.run_id,
                    "request_id": rid,
                    "model": name,
                    "grp": gi,
                    "phase": self.phase,
                    "arrival_s": arrival - self.t0,
                    "latency_s": latency if p.status == "ok" else None,
                    "status": p.status,
                    "slo_s": self.slo_s[name],
                    "t_arrival": arrival,  # monotonic, as the ranks' stage logs: not a DuckDB column
                    "t_finish": finish,
                }
            )
        if p.status == "ok":
            return 200, {"id": rid, "model": name, "latency_s": latency, "token": p.token}
        return 503, {"id": rid, "model": name, "status": p.status, "error": "dropped: it could not meet its SLO"}

    def take_rows(self) -> list[dict]:
        with self.lock:
            rows, self.rows = self.rows, []
        return rows

    def start_http(self, port: int = 0) -> int:
        router = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # one line per request on stderr is noise
                pass

            def _reply(self, code: int, data: dict) -> None:
                blob = json.dumps(data).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(blob)))
                self.end_headers()
                self.wfile.write(blob)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/models":
                    self._reply(200, {"served": router.served})
                else:
                    self._reply(404, {"error": f"no route {self.path}; POST /models/<name>", "served": router.served})

            def do_POST(self) -> None:
                parts = self.path.strip("/").split("/")
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if len(parts) != 2 or parts[0] != "models":
                    self._reply(404, {"error": f"no route {self.path}; POST /models/<name>", "served": router.served})
                    return
                self._reply(*router.handle(parts[1], body))

        self.http = ThreadingHTTPServer((LOOPBACK, port), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self.http.server_address[1]

    def stop(self) -> None:
        """Stop HTTP, then tell every group's first stage to end its pipeline."""
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        for gi, conn in self.lead.items():
            with self.lead_lock[gi]:
                try:
                    conn.sendall(b'{"stop": true}\n')
                except OSError:
                    pass
        self.ranks.close()
