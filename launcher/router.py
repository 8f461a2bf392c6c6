"""The request front end of `meshplan serve`: HTTP on 127.0.0.1, one route per model, ranks behind it.

`POST /models/<name>` (JSON body, optional `{"tokens": [ints]}`) is checked against the model before
it reaches a rank (`check_request`: a JSON object whose only key is `tokens`, a list of 1..seq_len
integers — booleans are not integers — each in 0..vocab-1; else 400 with one line naming the field),
then timed from arrival to reply: the router sends the request, with its deadline (arrival + the
model's SLO), to the first stage of a live group hosting the model (the least busy, when several
do) over that rank's TCP connection, and answers when the group's last stage reports it done (200,
with the next token: the argmax of the last position's logits of the first sequence), its first
stage dropped it because it could not meet its SLO (503 `dropped`), a rank failed on it (500
`error`, one line from the rank), or the group's ranks died with it in flight (503 `failed`). A model
whose every group is down (its ranks died and are restarting: launcher/serving.py) is answered 503
`refused` at once; `refused` and `failed` replies carry `Retry-After: 1`. An unknown model gets 404 with the served models listed. `GET /models` lists them.

Every request a model's route takes becomes a row for `serve_requests` (DuckDB, written by the caller
from `take_rows`: ranks and HTTP threads never hold the database): answered, dropped, failed, refused
or timed out alike. Requests refused at the edge (404, 400, 413) never reach routing and are not rows.

A group is up once its lead (first stage, tp rank 0) and its last stage's tp rank 0 of the current
generation have connected; when either connection ends (a rank died, or the group was stopped) the
group is down, and every request in flight on it is answered 503 `failed` at once. The HTTP server is
threaded with a listen backlog of `BACKLOG`, so a burst of hundreds of concurrent connections waits
in the kernel's queue instead of being reset.
"""

from __future__ import annotations

import errno
import http.client
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from planner.errors import MeshplanError
from planner.serve.placement import Placement
from planner.serve.workload import Trace
from planner.specs.config import SERVE_REQUEST_TIMEOUT_S

LOOPBACK = "127.0.0.1"
BACKLOG = 1024  # listen queue of the HTTP socket (socketserver's default 5 resets a burst of 200)
MAX_BODY = 1 << 20  # bytes of a request body; more is 413


class _Server(ThreadingHTTPServer):
    request_queue_size = BACKLOG
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that hung up (reset, broken pipe) is not the server's error: no traceback."""
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def check_request(body: bytes, seq_len: int, vocab: int) -> list[int] | None:
    """The tokens of a request body (None: the model's default input); ValueError with one line else."""
    try:
        req = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f'body must be JSON, optionally {{"tokens": [ints in 0..{vocab - 1}]}}') from None
    if not isinstance(req, dict):
        raise ValueError(f'body must be a JSON object, optionally {{"tokens": [ints in 0..{vocab - 1}]}}')
    extra = sorted(set(req) - {"tokens"})
    if extra:
        raise ValueError(f"unknown field {extra[0]!r}; the body takes only 'tokens'")
    tokens = req.get("tokens")
    if tokens is None:
        return None
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(f"tokens must be a non-empty list of ints in 0..{vocab - 1}")
    if len(tokens) > seq_len:
        raise ValueError(f"tokens: {len(tokens)} tokens, the model's seq_len is {seq_len}; send at most {seq_len}")
    for i, t in enumerate(tokens):
        if type(t) is not int or not 0 <= t < vocab:  # bool is an int subclass: refused
            raise ValueError(f"tokens[{i}] = {json.dumps(t)}: must be an int in 0..{vocab - 1}")
    return tokens


class _Pending:
    __slots__ = ("event", "status", "group", "token", "error")

    def __init__(self, group: int) -> None:
        self.event = threading.Event()
        self.status = "timeout"
        self.group = group
        self.token: int | None = None
        self.error: str | None = None


REPLIES = {
    "dropped": (503, "dropped: it could not meet its SLO"),
    "failed": (503, "failed: the group's ranks died while serving it (they restart); retry"),
    "refused": (503, "refused: every group hosting the model is down (restarting); retry"),
    "timeout": (504, "timed out waiting for the ranks"),
    "error": (500, "a rank failed on the request"),
}


class Router:
    """Rank connections, group health, routing and the request log (module docstring)."""

    def __init__(
        self, pl: Placement, slo_s: dict[str, float], run_id: str, request_timeout_s: float = SERVE_REQUEST_TIMEOUT_S
    ) -> None:
        self.pl, self.slo_s, self.run_id = pl, slo_s, run_id
        self.timeout_s = request_timeout_s
        self.hosts = {m.name: [i for i, g in enumerate(pl.groups) if m.name in g.models] for m in pl.models}
        self.served = sorted(n for n, gs in self.hosts.items() if gs)
        self.limits = {m.name: (m.spec.seq_len, m.spec.vocab_size) for m in pl.models}
        n = len(pl.groups)
        self.generation = [0] * n  # the generation whose connections count (launcher/serving.py sets it)
        self.conns: list[dict[str, socket.socket]] = [{} for _ in range(n)]  # role -> connection
        self.up = [False] * n
        self.ever_up = [False] * n  # the current generation was up once
        self.changed = threading.Condition()  # notified when a group goes up or down
        self.on_down: Callable[[int, int], None] = lambda group, generation: None
        self.lead_lock = [threading.Lock() for _ in range(n)]
        self.outstanding = [0] * n
        self.pending: dict[int, _Pending] = {}
        self.rows: list[dict] = []
        self.lock = threading.Lock()
        self.ids = itertools.count()
        self.t0 = time.monotonic()
        self.ranks = socket.create_server((LOOPBACK, 0))
        self.http: ThreadingHTTPServer | None = None
        self.phase = "serve"
        self.closing = False
        threading.Thread(target=self._accept, daemon=True, name="router-ranks").start()

    @property
    def rank_address(self) -> str:
        return f"{LOOPBACK}:{self.ranks.getsockname()[1]}"

    # ranks' side
    def _accept(self) -> None:
        while not self.closing:
            try:
                conn, _ = self.ranks.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._rank_conn, args=(conn,), daemon=True).start()

    def _rank_conn(self, conn: socket.socket) -> None:
        reader = conn.makefile("r")
        try:
            hello = json.loads(reader.readline() or "null")
            gi, role, gen = int(hello["group"]), hello["role"], int(hello.get("generation", 0))
        except (ValueError, TypeError, KeyError, OSError):
            conn.close()
            return
        with self.changed:
            if gen != self.generation[gi] or self.closing:
                conn.close()  # an older generation's rank, still winding down
                return
            self.conns[gi][role] = conn
            if {"lead", "done"} <= set(self.conns[gi]):
                self.up[gi] = self.ever_up[gi] = True
                self.changed.notify_all()
        try:
            for line in reader:
                msg = json.loads(line)
                with self.lock:
                    p = self.pending.get(int(msg["id"]))
                if p is not None:
                    p.status = msg["status"]
                    p.token = msg.get("token")
                    p.error = msg.get("error")
                    p.event.set()
        except (OSError, ValueError):
            pass
        self.group_down(gi, gen)

    def group_down(self, gi: int, gen: int) -> None:
        """Group `gi`'s generation `gen` is gone: fail what it had in flight, tell the supervisor once."""
        with self.changed:
            if gen != self.generation[gi] or not (self.up[gi] or self.conns[gi]):
                return
            self.up[gi] = False
            for c in self.conns[gi].values():
                try:
                    c.close()
                except OSError:
                    pass
            self.conns[gi] = {}
            self.changed.notify_all()
        with self.lock:
            for p in self.pending.values():
                if p.group == gi and not p.event.is_set():
                    p.status = "failed"
                    p.event.set()
        if not self.closing:
            self.on_down(gi, gen)

    def expect(self, gi: int, gen: int) -> None:
        """Group `gi`'s connections count from generation `gen` on (its ranks are being started)."""
        with self.changed:
            self.generation[gi] = gen
            self.up[gi] = self.ever_up[gi] = False
            self.conns[gi] = {}

    def wait_up(self, groups: list[int], timeout_s: float, alive: Callable[[], bool] = lambda: True) -> bool:
        """Until every group of `groups` is up (False: `timeout_s` passed, or `alive()` turned False)."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not all(self.up[g] for g in groups):
                left = deadline - time.monotonic()
                if left <= 0 or not alive():
                    return False
                self.changed.wait(min(left, 0.2))
        return True

    # clients' side
    def handle(self, name: str, body: bytes) -> tuple[int, dict]:
        """One request: (HTTP status, JSON reply)."""
        arrival = time.monotonic()
        if name not in self.hosts or not self.hosts[name]:
            return 404, {"error": f"model {name!r} is not served", "served": self.served}
        try:
            tokens = check_request(body, *self.limits[name])
        except ValueError as exc:
            return 400, {"error": str(exc)}
        rid = next(self.ids)
        with self.lock:
            live = [g for g in self.hosts[name] if self.up[g]]
            gi = min(live, key=lambda g: self.outstanding[g]) if live else self.hosts[name][0]
            self.outstanding[gi] += 1
            p = self.pending[rid] = _Pending(gi)
        if not live:
            p.status = "refused"
        else:
            msg = {"id": rid, "model": name, "deadline": arrival + self.slo_s[name]}
            if tokens is not None:
                msg["tokens"] = tokens
            try:
                with self.lead_lock[gi]:
                    self.conns[gi]["lead"].sendall((json.dumps(msg) + "\n").encode())
            except (OSError, KeyError):  # the group went down between the check and the send
                p.status = "failed"
                p.event.set()
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
        code, text = REPLIES.get(p.status, (500, p.status))
        if p.status == "error" and p.error:
            text = f"{text}: {p.error}"
        return code, {"id": rid, "model": name, "group": gi, "status": p.status, "error": text}

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
                if code == 503 and data.get("status") in ("refused", "failed"):
                    self.send_header("Retry-After", "1")  # a group restarts in seconds
                self.end_headers()
                self.wfile.write(blob)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/models":
                    self._reply(200, {"served": router.served})
                else:
                    self._reply(404, {"error": f"no route {self.path}; POST /models/<name>", "served": router.served})

            def do_POST(self) -> None:
                parts = self.path.strip("/").split("/")
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if not 0 <= length <= MAX_BODY:
                    self.close_connection = True
                    self._reply(413, {"error": f"Content-Length must be 0..{MAX_BODY} bytes"})
                    return
                body = self.rfile.read(length) if length else b""
                if len(parts) != 2 or parts[0] != "models":
                    self._reply(404, {"error": f"no route {self.path}; POST /models/<name>", "served": router.served})
                    return
                self._reply(*router.handle(parts[1], body))

        try:
            self.http = _Server((LOOPBACK, port), Handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise MeshplanError(
                    "--port", port, f"{LOOPBACK}:{port} is already in use; pass another --port"
                ) from None
            raise
        threading.Thread(target=self.http.serve_forever, daemon=True, name="router-http").start()
        return self.http.server_address[1]

    def stop_http(self) -> None:
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
            self.http = None

    def stop_groups(self) -> None:
        """Tell every live group's first stage to end its pipeline; no group counts as down after."""
        with self.changed:
            self.closing = True
            leads = [(gi, c.get("lead")) for gi, c in enumerate(self.conns)]
        for gi, conn in leads:
            if conn is None:
                continue
            with self.lead_lock[gi]:
                try:
                    conn.sendall(b'{"stop": true}\n')
                except OSError:
                    pass

    def close(self) -> None:
        self.stop_http()
        self.closing = True
        self.ranks.close()


def post(port: int, name: str, timeout_s: float, body: bytes = b"{}") -> int:
    """POST one request to the router on 127.0.0.1:`port`; its HTTP status."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout_s)
    try:
        conn.request("POST", f"/models/{name}", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def replay(
    port: int, trace: Trace, names: list[str], timeout_s: float = SERVE_REQUEST_TIMEOUT_S, t0: float | None = None
) -> list[int]:
    """Send each request of `trace` at its arrival time (relative to `t0`, time.monotonic(), default
    now); HTTP statuses in order. Each sending thread keeps its connection open (HTTP/1.1 keep-alive):
    a connect, an accept and a server thread per request would load the CPUs the ranks run on just
    when a burst arrives."""
    t0 = time.monotonic() if t0 is None else t0
    local, conns = threading.local(), []

    def send(name: str) -> int:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout_s)
            conns.append(conn)
        try:
            conn.request("POST", f"/models/{name}", body=b"{}", headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status
        except (OSError, http.client.HTTPException):
            conn.close()
            local.conn = None
            return post(port, name, timeout_s)  # once more, on a fresh connection

    futures = []
    try:
        with ThreadPoolExecutor(max_workers=64) as pool:
            for t, m in zip(trace.arrival_s.tolist(), trace.model.tolist(), strict=True):
                wait = t0 + t - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                futures.append(pool.submit(send, names[m]))
            return [f.result() for f in futures]
    finally:
        for conn in conns:
            conn.close()
