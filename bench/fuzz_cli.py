"""Drive every `meshplan` command with generated options and files; print outcomes per command.

    PYTHONPATH=. python bench/fuzz_cli.py [--examples 2000] [--commands plan,submit] [--seed 0] [--concurrent]

The same generator and oracle as tests/flows/test_cli_fuzz.py (tests/support/fuzz_cli.py), with
many more examples. Each command line runs in this process (the CLI's own entry, `run_cli`) on
one state folder; after each command's examples the DuckDB file must open and hold every job
queued. Prints a table: ok / one-line error / crash per command, and the first crashes in full.
Exit 1 when anything crashed, hung or the database was damaged.

The generator tries what users do (tests/support/fuzz_cli.py): binary and non-UTF-8 files, a
folder where a file goes, inf/NaN/huge numbers in files and options, plans made for another
cluster or model. `--concurrent` adds a second process that submits jobs to the same DuckDB file
the whole time, as a user's other shell would: every job either process queued must be there.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.pop("PREFECT_API_URL", None)

from hypothesis import HealthCheck, given, settings  # noqa: E402

from tests.support.fuzz_cli import COMMANDS, LAUNCHERS, Files, command_line, db_intact, outcome  # noqa: E402


def fuzz(command: str, files: Files, examples: int, seed: int) -> tuple[Counter, list[str], float]:
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
        kind, detail = outcome(argv, files)
        if command in LAUNCHERS and kind == "ok":
            kind, detail = "crash", f"{argv}: accepted; a launcher must refuse the bad value"
        counts[kind] += 1
        if kind == "crash" and len(crashes) < 5:
            crashes.append(detail)
        if command == "submit" and kind == "ok":
            jobs.add(detail.splitlines()[-1])

    t0 = time.perf_counter()
    from hypothesis import seed as hseed

    hseed(seed)(one)()
    damage = db_intact(files, jobs)
    if damage:
        counts["db damaged"] += 1
        crashes.append(damage)
    return counts, crashes, time.perf_counter() - t0


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


def start_submitter(files: Files) -> tuple[subprocess.Popen, Path]:
    """A second process submitting jobs to the same state folder until told to stop."""
    stop = files.root / "stop_submitter"
    stop.unlink(missing_ok=True)
    root = str(Path(__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": root}
    cmd = [sys.executable, "-c", _SUBMITTER, str(files.state), str(stop)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=root), stop


def stop_submitter(proc: subprocess.Popen, stop: Path) -> tuple[set[str], int]:
    """(the job ids it queued, its failed submissions)."""
    stop.touch()
    out, _ = proc.communicate(timeout=300)
    lines = out.splitlines()
    return {ln.split()[1] for ln in lines if ln.startswith("ok ")}, sum(1 for ln in lines if not ln.startswith("ok "))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=2000, help="generated command lines per command")
    ap.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated subset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrent", action="store_true", help="a second process submits jobs the whole time")
    args = ap.parse_args()
    rows = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fuzz_cli_") as tmp:
        os.environ["PREFECT_HOME"] = str(Path(tmp) / "prefect")
        os.chdir(tmp)  # relative paths the generator writes (missing.json, ...) stay in here
        files = Files(Path(tmp))
        submitter = start_submitter(files) if args.concurrent else None
        for command in args.commands.split(","):
            counts, crashes, wall = fuzz(command, files, args.examples, args.seed)
            rows.append((command, counts, wall))
            failed += [f"[{command}] {c}" for c in crashes]
            print(
                f"{command:17} ok {counts['ok']:5}  error {counts['error']:5}  crash {counts['crash']:3}"
                f"  {wall:6.1f} s",
                file=sys.stderr,
                flush=True,
            )
        if submitter is not None:
            queued, refused = stop_submitter(*submitter)
            lost = db_intact(files, queued)
            print(f"\nconcurrent submitter: {len(queued)} jobs queued, {refused} refused, db {lost or 'ok, none lost'}")
            if lost or refused:
                failed.append(f"[concurrent submitter] {refused} submissions failed; {lost or 'none lost'}")
    print(f"\n{'command':17} {'examples':>8} {'ok':>6} {'1-line error':>12} {'crash':>6} {'db':>4} {'wall s':>7}")
    for command, c, wall in rows:
        total = c["ok"] + c["error"] + c["crash"]
        db = "bad" if c["db damaged"] else "ok"
        print(f"{command:17} {total:8} {c['ok']:6} {c['error']:12} {c['crash']:6} {db:>4} {wall:7.1f}")
    for f in failed:
        print("\n" + f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
