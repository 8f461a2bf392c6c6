"""Generated command lines for every `meshplan` command, and the CLI's outcome on each, in-process.

Shared by tests/flows/test_cli_fuzz.py (a few examples per command, in CI) and bench/fuzz_cli.py
(thousands). The property: a command either succeeds (exit 0) or exits 1 with one line naming the
flag or field (`error: --flag=...` / `error: file: field=...`): never a traceback, never another exit
code, never a hang, and the DuckDB file still opens with every job it was told to queue.

Commands that launch processes (profile, train, run, ui; discover always gets --cluster, which
records the file without probing) are driven
only on their validation path: each generated line carries at least one value that must be
refused before anything starts (a number out of range, a word where a number goes), so a launch
would show as a hang or an `ok`, both of which the callers count as failures for those commands.
"""

from __future__ import annotations

import io
import json
import re
import signal
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args, get_origin

from hypothesis import strategies as st

from planner.specs.runspec import RunOptions, flag

ROOT = Path(__file__).parents[2]
PLAN_V1 = json.loads((ROOT / "tests" / "data" / "plan_v1.json").read_text())
CLUSTERS = [
    ROOT / "examples" / "clusters" / "mixed-a100-v100-t4.toml",
    ROOT / "examples" / "clusters" / "custom-links.toml",
]
MODEL_TOML = ROOT / "examples" / "models" / "llama-7b-like.toml"

# commands that would start processes or servers if their options were all valid
LAUNCHERS = {"profile", "train", "run", "ui"}

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\x00"), min_size=0, max_size=10
)
_junk_number = st.sampled_from(
    ["abc", "", "1e3", "nan", "inf", "-inf", "0x10", "99999999999999999999", "-64", "1.5", "٣", " 8", "8 "]
)


def ints(lo: int = -5, hi: int = 64) -> st.SearchStrategy[str]:
    """An option's value: mostly small integers, sometimes huge, negative or not a number."""
    return st.one_of(
        st.integers(lo, hi).map(str), st.integers().map(str), st.integers(-(2**70), 2**70).map(str), _junk_number
    )


def floats() -> st.SearchStrategy[str]:
    return st.one_of(
        st.floats(-10, 1000).map(repr), st.floats(allow_nan=True, allow_infinity=True).map(repr), _junk_number
    )


def bad_int() -> st.SearchStrategy[str]:
    """A value every integer option refuses at parsing: not a number, or beyond every bound."""
    return st.one_of(st.sampled_from(["abc", "", "nan", "1.5", "x1", "--"]), st.integers(2**63, 2**80).map(str))


def run_option_values(exclude: tuple[str, ...] = ()) -> dict[str, st.SearchStrategy[str] | None]:
    """A value per training flag, one generated per RunOptions field (cli/commands/run_options.py): the
    field's choices and words it refuses, or numbers as for any option. A new field is fuzzed unedited."""
    table: dict[str, st.SearchStrategy[str] | None] = {}
    for name, info in RunOptions.model_fields.items():
        kind = info.annotation
        if name in exclude:
            continue
        if get_origin(kind) is Literal:
            table[flag(name)] = st.sampled_from([*get_args(kind), "nope", ""])
        elif kind is bool:
            table[flag(name)] = None
        else:
            table[flag(name)] = ints(-3, 20) if kind is int else floats()
    return table


@dataclass
class Files:
    """The files generated lines point at: fixed ones, and one slot per kind rewritten per example."""

    root: Path
    state: Path = field(init=False)

    def __post_init__(self) -> None:
        self.state = self.root / "state"
        self.state.mkdir(parents=True, exist_ok=True)
        (self.root / "plan_ok.json").write_text(json.dumps(PLAN_V1))

    @property
    def db(self) -> Path:
        return self.state / "meshplan.duckdb"


def _plan_doc() -> st.SearchStrategy[str]:
    """plan_v1.json, valid or with one field replaced by a generated JSON value (strings for
    numbers, negatives, huge numbers, wrong shapes), or not JSON at all."""
    leaf = st.one_of(
        st.integers(-3, 9),
        st.integers(),
        st.text(max_size=6),
        st.sampled_from(["2", "1f1b", "gpipe", "zero3", None, True, 1.5, [], {}]),
        _numbers(),
    )
    keys = sorted(PLAN_V1)
    stage_keys = sorted(PLAN_V1["stages"][0])

    @st.composite
    def mutated(draw: st.DrawFn) -> str:
        doc = json.loads(json.dumps(PLAN_V1))
        if draw(st.booleans()):
            k = draw(st.sampled_from(keys))
            doc[k] = draw(leaf)
        else:
            i = draw(st.integers(0, 1))
            k = draw(st.sampled_from(stage_keys))
            doc["stages"][i][k] = draw(leaf)
        return json.dumps(doc)

    return st.one_of(
        st.just(json.dumps(PLAN_V1)),
        mutated(),
        st.text(max_size=40),
        st.sampled_from(_FOREIGN_PLANS).map(json.dumps),
    )


TOML_VALUES = [
    "-1", "0", "1e400", '"x"', "99999999999999999999", "[]", "nan", "inf", "-inf", "1e30", "1e15", "1e-300",
]  # fmt: skip

# what a user's file may be instead of the text meshplan expects: an image, a UTF-16 or Latin-1
# export, random bytes, a NUL in the middle (checked by planner/inputs.py, one line each)
_BINARY = st.one_of(
    st.binary(min_size=1, max_size=64),
    st.just(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"),
    st.just('name = "caf\u00e9"\n'.encode("utf-16")),
    st.just('name = "caf\u00e9"\n'.encode("latin-1")),
    st.just(b"name = 1\x00\n"),
)

# plans made for another cluster or another model than the one the line names: 16 devices (a
# cluster bigger than the examples'), gpt3-13b's 40 layers, a custom model's fingerprint
_FOREIGN_PLANS = [
    {**PLAN_V1, "stages": [{**PLAN_V1["stages"][0], "device_ids": [0, 15]}, *PLAN_V1["stages"][1:]]},
    {**PLAN_V1, "model": "gpt3-13b", "stages": [{**s, "layer_end": s["layer_end"] * 10, "layer_start": s["layer_start"] * 10} for s in PLAN_V1["stages"]]},
    {**PLAN_V1, "cluster": "elsewhere", "provenance": {**PLAN_V1.get("provenance", {}), "cluster_fingerprint": "0123456789abcdef"}},
    {**PLAN_V1, "provenance": {**PLAN_V1.get("provenance", {}), "model_fingerprint": "fedcba9876543210"}},
]  # fmt: skip


def _numbers() -> st.SearchStrategy[object]:
    """JSON numbers a generated file carries: huge, tiny, and the non-finite ones JSON cannot hold."""
    return st.one_of(
        st.sampled_from([1e30, 1e15, -1e30, 1e-300, 2**63, 2**64, float("inf"), float("nan"), -0.0]),
        st.floats(allow_nan=True, allow_infinity=True),
    )


def _toml_doc() -> st.SearchStrategy[str]:
    """A cluster TOML: an example file, one with a line dropped or a value replaced, or junk."""
    base = CLUSTERS[0].read_text().splitlines()

    @st.composite
    def mutated(draw: st.DrawFn) -> str:
        lines = list(base)
        i = draw(st.integers(0, len(lines) - 1))
        if draw(st.booleans()):
            del lines[i]
        elif "=" in lines[i]:
            key = lines[i].split("=", 1)[0]
            lines[i] = key + "= " + draw(st.sampled_from(TOML_VALUES))
        return "\n".join(lines) + "\n"

    return st.one_of(st.just("\n".join(base) + "\n"), mutated(), st.text(max_size=40))


def _model() -> st.SearchStrategy[list[str]]:
    custom = st.lists(
        st.tuples(
            st.sampled_from(["--layers", "--hidden", "--heads", "--kv-heads", "--ffn-hidden", "--vocab", "--seq-len"]),
            ints(1, 512),
        ),
        max_size=4,
    ).map(lambda kv: [t for pair in kv for t in pair])
    return st.one_of(
        st.just([]),
        st.sampled_from(["tiny", "gpt2-small", "gpt9", "llama3-8b", str(MODEL_TOML), "none.toml"]).map(
            lambda m: ["--model", m]
        ),
        st.tuples(st.just(["--model", "custom", "--layers", "4", "--hidden", "64", "--heads", "4"]), custom).map(
            lambda t: t[0] + t[1]
        ),
        custom,
    )


def _options(table: dict[str, st.SearchStrategy[str] | None]) -> st.SearchStrategy[list[str]]:
    """Any subset of a command's options, in any order; None marks a flag without a value."""

    @st.composite
    def build(draw: st.DrawFn) -> list[str]:
        names = draw(st.lists(st.sampled_from(sorted(table)), unique=True, max_size=len(table)))
        out: list[str] = []
        for n in names:
            out.append(n)
            if table[n] is not None:
                out.append(draw(table[n]))
        return out

    return build()


@st.composite
def command_line(draw: st.DrawFn, command: str, files: Files, cheap: bool = False) -> list[str]:
    """One generated `meshplan` argv for `command` (files written under files.root as a side effect).
    `cheap`: no line that would run a Prefect flow (CI's few examples; the bench runs them all)."""
    r = files.root

    def write(name: str, text: str | bytes) -> str:
        if isinstance(text, bytes):
            (r / name).write_bytes(text)
        else:
            (r / name).write_text(text)
        return str(r / name)

    def binary(name: str) -> st.SearchStrategy[str]:
        return _BINARY.map(lambda b: write(name, b))

    plan_file = st.one_of(
        st.just(str(r / "plan_ok.json")),
        _plan_doc().map(lambda t: write("gen_plan.json", t)),
        st.just("missing.json"),
        binary("bin_plan.json"),
        st.just(str(r)),  # a folder
    )
    cluster_file = st.one_of(
        st.sampled_from([str(c) for c in CLUSTERS]),
        _toml_doc().map(lambda t: write("gen_cluster.toml", t)),
        st.just("missing.toml"),
        binary("bin_cluster.toml"),
    )
    model = draw(st.one_of(_model(), binary("bin_model.toml").map(lambda p: ["--model", p])))
    budget = st.sampled_from(["0.05", "0.1", "-1", "nan", "1e12", "abc"])
    if command == "plan":
        opts = {
            "--global-batch": ints(1, 64),
            "--seq": ints(1, 256),
            "--top": ints(1, 6),
            "--budget": budget,
            "--cluster": cluster_file,
            "--json": None,
            "--no-store": None,
        }
        # a search always runs on a small budget: the fuzz is about inputs, not about search time
        preset = ["--model", "tiny", "--cluster", str(CLUSTERS[0])] if draw(st.booleans()) else []
        return ["plan", *(preset or model), *draw(_options(opts)), "--budget", draw(budget)]
    if command == "estimate":
        opts = {"--cluster": cluster_file, "--json": None}
        return ["estimate", "--plan", draw(plan_file), *model, *draw(_options(opts))]
    if command == "export":
        fmt = st.sampled_from(["torchtitan", "megatron", "deepspeed", ""])
        return ["export", draw(plan_file), "--format", draw(fmt), *model]
    if command == "compare":
        return ["compare", draw(plan_file), draw(plan_file), "--cluster", draw(cluster_file), *model]
    if command == "submit":
        opts = {
            "--global-batch": ints(1, 64),
            "--iterations": ints(1, 100),
            "--seq": ints(1, 256),
            "--priority": ints(-3, 3),
            "--deadline-s": floats(),
            "--gpu-kinds": st.one_of(st.sampled_from(["a100", "A100,v100", "h900", "cpu", ",", "t4, a10"]), _text),
            "--job-id": _text,
            **run_option_values(exclude=("steps",)),  # a job's steps are its --iterations
        }
        # mostly with what a job needs, so valid submissions (and the jobs they queue) are common too
        need = ["--model", "tiny", "--global-batch", draw(ints(1, 64)), "--iterations", draw(ints(1, 100))]
        given = [] if draw(st.integers(0, 4)) == 0 else need
        return ["submit", *(model if not given else []), *given, *draw(_options(opts))]
    if command == "jobs":
        return [
            "jobs",
            *draw(_options({"--state": st.one_of(_text, st.just("queued")), "--events": None, "--json": None})),
        ]
    if command == "calibrate":
        runs = st.one_of(
            _runs_csv().map(lambda t: write("gen_runs.csv", t)), binary("bin_runs.csv"), st.just("missing.csv")
        )
        return ["calibrate", "--runs", draw(runs), *draw(_options({"--json": None}))]
    if command == "serve-simulate":
        opts = {
            "--duration-s": floats(),
            "--trace": st.one_of(binary("bin_replay.csv"), _replay_csv().map(lambda t: write("gen_replay.csv", t))),
        }
        placement = st.one_of(
            binary("bin_placement.json"), st.just("missing.json"), _text.map(lambda t: write("gen_placement.json", t))
        )
        return [
            "serve-simulate",
            "--placement",
            draw(placement),
            "--cluster",
            draw(cluster_file),
            *draw(_options(opts)),
        ]
    if command == "cancel":
        return ["cancel", draw(st.one_of(_text.filter(lambda s: not s.startswith("-")), st.just("nope")))]
    if command == "db":
        # reads only: writing SQL is `db --write`'s concern; the fuzz checks bad SQL is one line
        return [
            "db",
            *draw(
                st.one_of(
                    st.just([]),
                    _text.map(lambda s: ["select " + s]),
                    st.just(["select * from jobs"]),
                    # small results: drawing a table of hundreds of rows is not what the fuzz is about
                    st.integers(0, 20).map(lambda k: [f"select * from range({k})"]),
                    # past the row cap (MAX_DB_ROWS and its note), as CSV: a 10,000-row rich table took ~2 s
                    # of CPU an example, and Hypothesis draws the bound 0 of integers(0, 20) often
                    st.sampled_from(["csv", "json"]).map(lambda f: ["select * from range(10000000)", "--format", f]),
                )
            ),
        ]
    if command in ("gpus", "models"):
        return [command]
    if command == "simulate":
        opts = {
            "--policy": st.sampled_from(["jct", "fcfs", "all", "nope"]),
            "--round-s": floats(),
            "--speed": cluster_file,
        }
        trace = st.one_of(
            st.just("missing.csv"),
            _text.map(lambda t: write("gen_trace.csv", t)),
            binary("bin_trace.csv"),
            _jobs_csv().map(lambda t: write("gen_jobs.csv", t)),
        )
        return [
            "simulate",
            "--trace",
            draw(trace),
            "--cluster",
            draw(cluster_file),
            *draw(_options(opts)),
            "--plot",
            str(r / "sim.png"),
        ]
    if command == "schedule-cluster":
        opts = {
            "--every": st.sampled_from(["30s", "5m", "0s", "-1m", "abc", "99999999999d"]),
            "--policy": st.sampled_from(["jct", "nope"]),
        }
        return ["schedule-cluster", "--cluster", draw(cluster_file), *draw(_options(opts))]
    if command == "replan":
        return [
            "replan",
            "--run-id",
            draw(_text),
            *draw(_options({"--json": None, "--dry-run": None, "--cluster": cluster_file})),
        ]
    if command == "schedule":
        opts = {"--every": st.sampled_from(["30s", "5m", "0s", "-1m", "abc"]), "--cluster": cluster_file}
        return ["schedule", "--run-id", draw(_text), *draw(_options(opts))]
    if command == "discover":
        # with --cluster it records the file (no processes); a bad --num-ranks is refused first
        opts = {"--num-ranks": ints(1, 4), "--json": None, "--refresh": None}
        line = ["discover", "--cluster", draw(cluster_file), *draw(_options(opts))]
        return line + (["--num-ranks", draw(bad_int())] if cheap else [])
    # launchers: one value that must be refused before anything starts, among other options
    if command == "train":
        bad = draw(st.sampled_from(["--steps", "--nproc-per-node", "--nnodes", "--slow-rank", "--slow-from-step"]))
        others = {"--plan": plan_file, "--dry-run": None, "--json": None, **run_option_values(exclude=("steps",))}
        return ["train", *draw(_options(others)), bad, draw(bad_int())]
    if command == "run":
        bad = draw(st.sampled_from(["--steps", "--ranks"]))
        return ["run", *draw(_options({"--model": st.sampled_from(["tiny", "gpt9"])})), bad, draw(bad_int())]
    if command == "profile":
        bad = draw(st.sampled_from(["--mbs", "--tp", "--seq"]))
        junk = st.sampled_from(["abc", "1.5", "x", "1,,y", "nan"])
        return ["profile", *draw(_options({"--model": st.sampled_from(["tiny", "gpt9"])})), bad, draw(junk)]
    if command == "ui":
        return ["ui", "--port", draw(st.one_of(bad_int(), st.sampled_from(["0", "-1", "65536", "70000"])))]
    raise ValueError(command)


def _runs_csv() -> st.SearchStrategy[str]:
    """A measured-runs CSV (calibrate --runs): one valid row, or one field made huge, non-finite or a word."""
    head = (
        "layers,hidden,heads,seq_len,vocab,global_batch,micro_batch,tp,pp,dp,gpu,num_gpus,gpus_per_node,tokens_per_sec"
    )
    row = ["32", "4096", "32", "2048", "32000", "512", "1", "8", "1", "8", "A100-SXM4-80GB", "64", "8", "150000"]

    @st.composite
    def build(draw: st.DrawFn) -> str:
        cells = list(row)
        if draw(st.booleans()):
            i = draw(st.integers(0, len(cells) - 1))
            cells[i] = draw(
                st.sampled_from(["inf", "nan", "-inf", "1e400", "0", "-1", "abc", "", "1e30", "99999999999"])
            )
        return head + "\n" + ",".join(cells) + "\n"

    return build()


def _jobs_csv() -> st.SearchStrategy[str]:
    """A meshplan-format jobs trace whose one row carries a huge or non-finite number."""
    head = "job_id,submit_s,model,global_batch,iterations"
    bad = st.sampled_from(["nan", "inf", "1e12", "1e400", "-1", "5"])

    @st.composite
    def build(draw: st.DrawFn) -> str:
        return f"{head}\nj1,{draw(bad)},tiny,{draw(st.sampled_from(['8', 'inf', '1e30']))},{draw(bad)}\n"

    return build()


def _replay_csv() -> st.SearchStrategy[str]:
    """A serving trace (model,arrival_s) with arrivals huge, non-finite or out of order."""
    times = st.lists(st.sampled_from(["0", "1", "1e12", "nan", "inf", "-1", "0.5", "86400"]), min_size=1, max_size=4)
    return times.map(lambda ts: "model,arrival_s\n" + "".join(f"m,{t}\n" for t in ts))


COMMANDS = [
    "plan",
    "estimate",
    "export",
    "compare",
    "submit",
    "jobs",
    "calibrate",
    "serve-simulate",
    "cancel",
    "db",
    "gpus",
    "models",
    "simulate",
    "schedule-cluster",
    "replan",
    "schedule",
    "discover",
    "train",
    "run",
    "profile",
    "ui",
]

_NAMES_SOMETHING = re.compile(r"^error: \S.*(=|--|: )")


class Hang(Exception):
    pass


def _alarm(*_: object) -> None:
    raise Hang()


def outcome(argv: list[str], files: Files, timeout_s: int = 60) -> tuple[str, str]:
    """('ok' | 'error' | 'crash', detail) for `meshplan --state-dir STATE argv`, run in this process."""
    from cli.main import run_cli

    full = ["--state-dir", str(files.state), *argv]
    out, err = io.StringIO(), io.StringIO()
    old_argv, old_handler = sys.argv, signal.signal(signal.SIGALRM, _alarm)
    sys.argv = ["meshplan", *full]  # profile reads space-separated lists from the raw command line
    signal.alarm(timeout_s)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            rc = run_cli(full)
    except Hang:
        return "crash", f"hang > {timeout_s} s: {argv}"
    except BaseException as exc:  # noqa: BLE001 - a crash is what the property looks for
        return "crash", f"{argv}\n{''.join(traceback.format_exception(exc))}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
        sys.argv = old_argv
    return classify(argv, rc, out.getvalue(), err.getvalue())


def classify(argv: list[str], rc: int, out: str, err: str) -> tuple[str, str]:
    """The property on one command's exit code and output, in this process or a real one: exit 0,
    or exit 1 with one line naming a flag or field; a traceback or anything else is a crash."""
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("warning: ", "note: "))]
    lines = [ln for ln in lines if "EventsWorker" not in ln]
    text = err + out
    if "Traceback" in text:
        return "crash", f"{argv}: traceback printed\n{text[-2000:]}"
    if rc == 0:
        return "ok", out.strip()[-200:]
    if rc == 1 and len(lines) == 1 and _NAMES_SOMETHING.match(lines[0]):
        return "error", lines[0]
    if rc == 1 and not lines and out.strip():
        return "ok", "a result that says no (does not fit / infeasible)"  # estimate, plan --json
    return "crash", f"{argv}: rc={rc}\nstderr: {err[-2000:]}"


def db_intact(files: Files, job_ids: set[str]) -> str | None:
    """None when the DuckDB file opens and holds every job submitted; else what is wrong."""
    if not files.db.exists():
        return None if not job_ids else f"{files.db} is gone but {len(job_ids)} jobs were queued"
    from storage.db import query, tables

    try:
        tables(files.db)
        have = set(query(files.db, "SELECT job_id FROM jobs")["job_id"].to_list()) if job_ids else set()
    except Exception as exc:  # noqa: BLE001
        return f"{files.db}: {type(exc).__name__}: {exc}"
    lost = job_ids - have
    return f"jobs lost: {sorted(lost)[:5]}" if lost else None
