"""Drive every `meshplan` command with generated options and files; print outcomes per command.

    PYTHONPATH=. python bench/fuzz_cli.py [--examples 2000] [--commands plan,submit] [--seed 0]
        [--jobs 4] [--subprocess 50] [--budget-s 3600] [--concurrent]

The same generator and oracle as tests/flows/test_cli_fuzz.py (tests/support/fuzz_cli.py), with
many more examples. Each command line runs in process (the CLI's own entry, `run_cli`, whose
SystemExit and one-line errors it turns into an exit code): an exception escaping it, a printed
"Traceback", an exit code other than 0/1 or an error that is not one line naming a flag or field is
a crash; an example past 60 s (SIGALRM) is a hang. After each command's examples the DuckDB file
must open and hold every job queued. `--jobs N` spreads the commands over N worker processes, each
with its own state folder and Prefect home. `--subprocess K` runs K more generated lines per command
as real `python -m cli` processes (exit code, stdout/stderr, no Traceback, under 180 s: above
Prefect's 120 s allowance to start its temporary server) to check real process behaviour.
Prints a table: ok / one-line error / crash per command, and the first crashes in full.
Exit 1 when anything crashed, hung or the database was damaged.

Every command runs the full count (`--examples`) in process; `--light N` lowers discover's
(each valid line records a cluster through a Prefect flow, ≈ 0.5–1.5 s). train, run, profile and ui:
every line carries a value that must be refused before anything starts (tests/support/fuzz_cli.py),
so they run on their validation path only.
Prefect's temporary server starts once per worker before the clock (a warm-up discover, no alarm):
its first start migrates a fresh SQLite DB, which under load took past the 60 s an example gets
(the one "discover hang" seen was this, not meshplan).

`--budget-s` bounds a worker's wall time: each command gets a share of it in proportion to the
estimated cost of its targets (`COST` per example in process, `PROCESS_COST` per process), split
between its processes (run first) and its in-process examples in the same proportion, each part at
least its slice; time a command leaves unused passes on to the next, time it overran is taken from
the commands after it. Under a budget too small for every target, every command reaches
about the same fraction of its targets (the table says how many ran; the rest were drawn, not run).

The generator tries what users do (tests/support/fuzz_cli.py): binary and non-UTF-8 files, a
folder where a file goes, inf/NaN/huge numbers in files and options, plans made for another
cluster or model. `--concurrent` adds a second process that submits jobs to the same DuckDB file
the whole time, as a user's other shell would: every job either process queued must be there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.pop("PREFECT_API_URL", None)

from hypothesis import HealthCheck, given, settings  # noqa: E402

from launcher import group  # noqa: E402
from tests.support.fuzz_cli import (  # noqa: E402
    CLUSTERS,
    COMMANDS,
    LAUNCHERS,
    Files,
    classify,
    command_line,
    db_intact,
    outcome,
)

LIGHT = {"discover"}  # a valid line runs a Prefect flow: --light examples when given
FLOWS = {"discover", "replan", "schedule", "schedule-cluster"}  # may start Prefect's temporary server
SERVES = {"schedule", "schedule-cluster"}  # with a `meshplan ui` server, a valid line serves until Ctrl-C
# wall seconds of one in-process example (measured 2026-12-07, 60 examples each, load ~10 on 2 cores):
# only their ratios matter, to share a budget and balance workers
COST = {
    "plan": 0.29, "discover": 0.46, "jobs": 0.13, "cancel": 0.13, "replan": 0.11, "db": 0.1, "gpus": 0.09,
    "models": 0.06, "compare": 0.06, "simulate": 0.06, "train": 0.06,
}  # fmt: skip
DEFAULT_COST = 0.05
# wall seconds of one `python -m cli` process (one that runs a flow starts its own Prefect server)
PROCESS_COST = {"discover": 6.0, "replan": 2.0, "schedule": 2.0, "schedule-cluster": 2.0}
DEFAULT_PROCESS_COST = 1.2
SUBPROCESS_TIMEOUT_S = 180


def fuzz(
    command: str, files: Files, examples: int, seed: int, until: float = float("inf")
) -> tuple[Counter, list[str]]:
    counts: Counter = Counter()
    crashes: list[str] = []
    jobs: set[str] = set()

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(argv=command_line(command, files))
    def one(argv: list[str]) -> None:
        if time.perf_counter() > until:  # the time budget is spent: the rest are drawn, not run
            return
        kind, detail = outcome(argv, files)
        note(command, kind, detail, argv, counts, crashes, jobs)

    from hypothesis import seed as hseed

    hseed(seed)(one)()
    damage = db_intact(files, jobs)
    if damage:
        counts["db damaged"] += 1
        crashes.append(damage)
    return counts, crashes


def note(command, kind, detail, argv, counts, crashes, jobs) -> None:
    if command in LAUNCHERS and kind == "ok":
        kind, detail = "crash", f"{argv}: accepted; a launcher must refuse the bad value"
    counts[kind] += 1
    if kind == "crash":
        counts[crash_kind(detail)] += 1
        if len(crashes) < 5:
            crashes.append(detail)
    if command == "submit" and kind == "ok":
        jobs.add(detail.splitlines()[-1])


def crash_kind(detail: str) -> str:
    """hang (past the time limit), traceback (an exception escaped the CLI or one was printed), or
    bad exit (an exit code other than 0/1, or an error that is not one line naming a flag or field)."""
    if detail.startswith("hang"):
        return "hang"
    return "traceback" if "Traceback" in detail or "traceback printed" in detail else "bad exit"


def in_subprocess(argv: list[str], files: Files) -> tuple[str, str]:
    """The outcome of `python -m cli --state-dir STATE argv` as a real process."""
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(files.state), *argv]
    try:  # the one way meshplan starts and stops processes (launcher/group.py): a hang is stopped whole
        p = group.run(cmd, SUBPROCESS_TIMEOUT_S, "meshplan", extra_env={"PYTHONPATH": str(ROOT)}, cwd=files.root)
    except TimeoutError:
        return "crash", f"hang > {SUBPROCESS_TIMEOUT_S} s (process): {argv}"
    return classify(argv, p.returncode, p.stdout, p.stderr)


def fuzz_subprocess(
    command: str, files: Files, examples: int, seed: int, until: float = float("inf")
) -> tuple[Counter, list[str]]:
    counts: Counter = Counter()
    crashes: list[str] = []
    jobs: set[str] = set()

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(argv=command_line(command, files))
    def one(argv: list[str]) -> None:
        if time.perf_counter() > until:
            return
        kind, detail = in_subprocess(argv, files)
        note(command, kind, detail, argv, counts, crashes, jobs)

    from hypothesis import seed as hseed

    hseed(seed + 1)(one)()
    damage = db_intact(files, jobs)
    if damage:
        counts["db damaged"] += 1
        crashes.append(damage)
    return counts, crashes


def warm_prefect(files: Files) -> float:
    """Start this process's Prefect temporary server (a discover of a cluster file) with no alarm."""
    import contextlib
    import io

    from cli.main import run_cli

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        rc = run_cli(["--state-dir", str(files.state), "discover", "--cluster", str(CLUSTERS[0])])
    if rc != 0:
        raise SystemExit(f"warm-up discover failed: exit {rc}")
    return time.perf_counter() - t0


def seed_db(files: Files) -> None:
    """A state folder with its DuckDB file, as a user's after a first command (a job queued): `db`,
    `jobs` and `cancel` then read a real store (the no-store line is tests/flows/test_cli_errors.py's)."""
    import contextlib
    import io

    from cli.main import run_cli

    with contextlib.redirect_stdout(io.StringIO()):
        rc = run_cli(
            ["--state-dir", str(files.state), "submit", "--model", "tiny", "--global-batch", "8", "--iterations", "3"]
        )
    if rc != 0:
        raise SystemExit(f"seeding the store failed: exit {rc}")


def worker(commands: list[str], root: Path, args: argparse.Namespace) -> list[dict]:
    """Fuzz `commands` in this process on a state folder under `root`; one result row per command."""
    import warnings

    from hypothesis.errors import HypothesisDeprecationWarning

    # the CLI's own use of `random` (temporary names) inside an example is not the generator's
    warnings.filterwarnings("ignore", category=HypothesisDeprecationWarning)
    os.environ["PREFECT_HOME"] = str(root / "prefect")
    os.chdir(root)  # relative paths the generator writes (missing.json, ...) stay in here
    files = Files(root)
    seed_db(files)
    warm = warm_prefect(files) if FLOWS & set(commands) else None
    server = ui_server(files) if FLOWS & set(commands) and args.subprocess else None
    try:
        return fuzz_commands(commands, files, args, warm)
    finally:
        if server is not None:
            from flows.server import stop_server

            stop_server(server, files.state)


def ui_server(files: Files) -> group.Process:
    """The state folder's Prefect server, as `meshplan ui` leaves one running: the flow commands'
    processes send their runs there, as a user's do while the UI is open, instead of each starting a
    temporary server (≈ 10 s each quiet, 60 s under load: 2 discover processes in 120 s). Its own
    Prefect home: the worker's temporary server has the worker's SQLite file."""
    from flows.server import start_server
    from tests.support.served import free_port

    home = os.environ["PREFECT_HOME"]
    os.environ["PREFECT_HOME"] = str(files.root / "prefect-ui")
    try:
        proc = start_server(files.state, port=free_port(), wait_s=300)
    finally:
        os.environ["PREFECT_HOME"] = home
    with server_shown(files, False):  # hidden until a command's processes may use it
        pass
    return proc


@contextlib.contextmanager
def server_shown(files: Files, show: bool) -> Iterator[None]:
    """The state folder's Prefect server, where commands find it (<state>/prefect-server.json), for
    the processes of a command that may use it; hidden the rest of the time (ui_server). Never for
    `schedule`/`schedule-cluster`: with a server, a valid line serves its schedule until Ctrl-C, as
    it should (a 180 s "hang" in the first run with the server); without, it is refused in one line
    (run `meshplan ui` first). Nor in process: the CLI would keep its address in os.environ."""
    from flows.server import server_file

    f = server_file(files.state)
    aside = f.with_name(f.name + ".hidden")
    if show and aside.exists():
        aside.replace(f)
    try:
        yield
    finally:
        if f.exists():
            f.replace(aside)


def fuzz_commands(commands: list[str], files: Files, args: argparse.Namespace, warm: float | None) -> list[dict]:
    rows = []
    end = time.perf_counter() + (args.budget_s or float("inf"))
    cost_in = {c: examples(c, args) * COST.get(c, DEFAULT_COST) for c in commands}
    cost_sub = {c: args.subprocess * PROCESS_COST.get(c, DEFAULT_PROCESS_COST) for c in commands}
    for i, command in enumerate(commands):
        n = examples(command, args)
        # --budget-s: what is left, shared by the commands left in proportion to their estimated cost;
        # within a command, processes first, each part its slice at least (an example or a process
        # past its slice's end only delays the commands after it: they share what is left)
        left = end - time.perf_counter()
        share = left * (cost_in[command] + cost_sub[command]) / sum(cost_in[c] + cost_sub[c] for c in commands[i:])
        slice_sub = share * cost_sub[command] / (cost_in[command] + cost_sub[command] or 1)
        t1 = time.perf_counter()
        with server_shown(files, command not in SERVES):
            sub, sub_crashes = (
                fuzz_subprocess(command, files, args.subprocess, args.seed, t1 + slice_sub)
                if args.subprocess
                else ({}, [])
            )
        sub_wall = time.perf_counter() - t1
        t0, c0 = time.perf_counter(), time.process_time()
        until_in = max(t1 + share, t0 + share - slice_sub)
        counts, crashes = fuzz(command, files, n, args.seed, until_in) if n else (Counter(), [])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append(
            {
                "command": command,
                "counts": dict(counts),
                "wall_s": wall,
                "cpu_s": cpu,
                "warm_s": warm,
                "sub": dict(sub),
                "sub_wall_s": sub_wall,
                "crashes": crashes + [f"(process) {c}" for c in sub_crashes],
            }
        )
        print(f"{command:17} {dict(counts)}  {wall:6.1f} s; processes {dict(sub)}", file=sys.stderr, flush=True)
        Path(args.partial).write_text(json.dumps(rows))  # what is done survives a worker stopped later
    return rows


_SUBMITTER = """
import sys
from cli.main import run_cli
state, stop = sys.argv[1], sys.argv[2]
import os, io, contextlib
n = 0
while not os.path.exists(stop):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = run_cli(["--state-dir", state, "submit", "--model", "tiny", "--global-batch", "8", "--iterations", "3"])
    line = out.getvalue().strip().splitlines()[-1:] if rc == 0 else []
    print(("ok " + line[0]) if line else f"rc {rc}", flush=True)
    n += 1
"""


def start_submitter(files: Files) -> tuple[group.Process, Path]:
    """A second process submitting jobs to the same state folder until told to stop."""
    stop = files.root / "stop_submitter"
    stop.unlink(missing_ok=True)
    cmd = [sys.executable, "-c", _SUBMITTER, str(files.state), str(stop)]
    return group.start(cmd, extra_env={"PYTHONPATH": str(ROOT)}, cwd=ROOT, capture=True, show_stderr=True), stop


def stop_submitter(proc: group.Process, stop: Path) -> tuple[set[str], int]:
    """(the job ids it queued, its failed submissions)."""
    stop.touch()
    out, _ = proc.communicate(timeout=300)
    lines = out.splitlines()
    return {ln.split()[1] for ln in lines if ln.startswith("ok ")}, sum(1 for ln in lines if not ln.startswith("ok "))


def examples(command: str, args: argparse.Namespace) -> int:
    """In-process examples to run for `command` (--light for discover when given, else --examples)."""
    return args.light if command in LIGHT and args.light is not None else args.examples


def split(commands: list[str], n: int, args: argparse.Namespace) -> list[list[str]]:
    """Commands over n workers, the costliest first onto the least loaded (longest-processing-time)."""
    cost = {
        c: COST.get(c, DEFAULT_COST) * examples(c, args) + args.subprocess * PROCESS_COST.get(c, DEFAULT_PROCESS_COST)
        for c in commands
    }
    bins: list[tuple[float, list[str]]] = [(0.0, []) for _ in range(max(1, n))]
    for c in sorted(commands, key=cost.get, reverse=True):
        i = min(range(len(bins)), key=lambda k: bins[k][0])
        bins[i] = (bins[i][0] + cost[c], [*bins[i][1], c])
    return [b for _, b in bins if b]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=2000, help="generated command lines per command, in process")
    ap.add_argument("--light", type=int, help="fewer examples for discover (a Prefect flow per valid line)")
    ap.add_argument("--subprocess", type=int, default=50, help="more lines per command as real processes")
    ap.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated subset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (each its own state folder)")
    ap.add_argument(
        "--budget-s", type=float, default=0, help="wall seconds per worker (0: none); the table says how many ran"
    )
    ap.add_argument("--partial", help=argparse.SUPPRESS)
    ap.add_argument("--concurrent", action="store_true", help="a second process submits jobs the whole time")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: ROOT,OUT,CMD1,CMD2...
    args = ap.parse_args()
    if args.worker:
        root, out, *commands = args.worker.split(",")
        args.partial = out
        Path(out).write_text(json.dumps(worker(commands, Path(root), args)))
        return 0
    commands = args.commands.split(",")
    failed: list[str] = []
    t0, c0 = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory(prefix="fuzz_cli_") as tmp:
        base = Path(tmp)
        submitter = start_submitter(Files(base / "w0")) if args.concurrent else None
        procs = []
        for i, cmds in enumerate(split(commands, args.jobs, args)):
            root, out = base / f"w{i}", base / f"w{i}.json"
            root.mkdir(exist_ok=True)
            cmd = [sys.executable, __file__, "--worker", ",".join([str(root), str(out), *cmds])]
            cmd += ["--examples", str(args.examples), "--seed", str(args.seed)]
            cmd += ["--light", str(args.light)] if args.light is not None else []
            cmd += ["--subprocess", str(args.subprocess), "--budget-s", str(args.budget_s)]
            procs.append((group.start(cmd), out, cmds))
        rows = []
        for p, out, cmds in procs:
            rc = p.wait()
            group.forget(p)
            if rc != 0 or not out.exists():
                failed.append(f"[worker {cmds}] exited {rc} with no results")
                continue
            rows += json.loads(out.read_text())
        if submitter is not None:
            queued, refused = stop_submitter(*submitter)
            lost = db_intact(Files(base / "w0"), queued)
            print(f"\nconcurrent submitter: {len(queued)} jobs queued, {refused} refused, db {lost or 'ok, none lost'}")
            if lost or refused:
                failed.append(f"[concurrent submitter] {refused} submissions failed; {lost or 'none lost'}")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rows.sort(key=lambda r: commands.index(r["command"]))
    print(
        f"\n{'command':17} {'examples':>8} {'ok':>6} {'1-line error':>12} {'traceback':>9} {'hang':>5}"
        f" {'bad exit':>8} {'db':>4}"
        f" {'wall s':>7} {'cpu s':>6} | {'processes':>9} {'ok':>4} {'error':>5} {'crash':>5}"
    )
    for r in rows:
        c, s = Counter(r["counts"]), Counter(r["sub"])
        total = c["ok"] + c["error"] + c["crash"]
        db = "bad" if c["db damaged"] or s["db damaged"] else "ok"
        print(
            f"{r['command']:17} {total:8} {c['ok']:6} {c['error']:12} {c['traceback']:9} {c['hang']:5}"
            f" {c['bad exit']:8} {db:>4}"
            f" {r['wall_s']:7.1f} {r['cpu_s']:6.1f} | {s['ok'] + s['error'] + s['crash']:9} {s['ok']:4}"
            f" {s['error']:5} {s['crash']:5}"
        )
        failed += [f"[{r['command']}] {x}" for x in r["crashes"]]
    warms = [r["warm_s"] for r in rows if r["warm_s"] is not None]
    if warms:
        print(f"\nPrefect temporary server warm-up (first discover, no alarm): {max(warms):.1f} s at most")
    print(f"all: {wall:.0f} s wall over {len(procs)} worker(s); this process {cpu:.1f} s CPU")
    for f in failed:
        print("\n" + f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
