"""Inputs checked once, at the edge (issue #36): every file a user hands meshplan goes through one
reader (planner/inputs.py: exists, size, text, UTF-8), every number is finite and bounded
(planner/limits.py), outputs never overwrite inputs, and a refused command writes nothing — each
one line naming the flag or field, exit 1. In-process (cli.main.run_cli), no Prefect server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.fuzz_cli import PLAN_V1, Files, outcome

ROOT = Path(__file__).parents[2]
MIXED = str(ROOT / "examples/clusters/mixed-a100-v100-t4.toml")
PLAN = str(ROOT / "tests/data/plan_v1.json")
CPU2 = (ROOT / "tests/data/cpu-2ranks.toml").read_text()
LATIN1 = 'name = "caf\xe9"\n'.encode("latin-1")
WORKLOAD = """name = "w"
duration_s = {duration}
[[models]]
name = "m"
preset = "gpt2-small"
seq = 512
rate = {rate}
cv = {cv}
slo_scale = 5
"""
PLACEMENT = {
    "method": "manual",
    "cluster": "cpu-2",
    "dtype": "fp32",
    "models": [
        {
            "name": "m",
            "dims": {"name": "m", "hidden": 256, "num_layers": 4, "num_heads": 4, "vocab_size": 512, "seq_len": 128},
            "rate": 5,
            "cv": 2,
            "slo_s": 5.0,
        }
    ],
    "groups": [{"devices": [0, 1], "kind": "cpu", "pp": 2, "tp": 1, "models": ["m"]}],
}
RUNS_HEAD = (
    "layers,hidden,heads,seq_len,vocab,global_batch,micro_batch,tp,pp,dp,gpu,num_gpus,gpus_per_node,tokens_per_sec"
)
RUNS_ROW = "32,4096,32,2048,32000,512,1,8,1,8,A100-SXM4-80GB,64,8,{tps}"


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    return Files(tmp_path)


def _w(files: Files, name: str, data: str | bytes) -> str:
    p = files.root / name
    p.write_bytes(data) if isinstance(data, bytes) else p.write_text(data)
    return str(p)


def _error(argv: list[str], files: Files, *needles: str) -> str:
    kind, line = outcome(argv, files)
    assert kind == "error", (argv, kind, line)
    for n in needles:
        assert n in line, (n, line)
    return line


def _nothing_written(files: Files) -> None:
    """No DuckDB file (or one without runs, jobs or snapshots) and no run folder."""
    assert not (files.state / "runs").exists() or not any((files.state / "runs").iterdir())
    if files.db.exists():
        from storage.db import query

        for table in ("runs", "hardware_snapshots"):
            assert query(files.db, f"SELECT count(*) AS n FROM {table}")["n"][0] == 0, table


# --- one reader: encoding, size, type --------------------------------------------------------------

# (reader, argv with {bad} where the non-UTF-8 file goes, the flag the line must name)
READERS = {
    "cluster": (["plan", "--model", "tiny", "--cluster", "{bad}"], "--cluster="),
    "model": (["plan", "--model", "{bad}.toml", "--cluster", MIXED], "--model="),
    "plan (estimate)": (["estimate", "--plan", "{bad}", "--cluster", MIXED], "--plan="),
    "plan (export)": (["export", "{bad}", "--format", "torchtitan"], "plan="),
    "plan (compare)": (["compare", PLAN, "{bad}", "--cluster", MIXED], "plan_b="),
    "plan (train)": (["train", "--plan", "{bad}", "--steps", "2"], "--plan="),
    "config": (["--config", "{bad}", "plan", "--model", "tiny", "--cluster", MIXED], "--config="),
    "workload": (["serve-plan", "--workload", "{bad}", "--cluster", MIXED], "--workload="),
    "placement": (["serve-simulate", "--placement", "{bad}", "--cluster", "{cpu}"], "--placement="),
    "serving trace": (["serve-simulate", "--placement", "{pl}", "--cluster", "{cpu}", "--trace", "{bad}"], "--trace="),
    "jobs trace": (["simulate", "--trace", "{bad}", "--cluster", MIXED, "--plot", "{out}"], "--trace="),
    "speed table": (
        ["simulate", "--trace", "{jobs}", "--cluster", MIXED, "--speed", "{bad}", "--plot", "{out}"],
        "--speed=",
    ),
    "runs CSV": (["calibrate", "--runs", "{bad}"], "--runs="),
    "discover cluster": (["discover", "--cluster", "{bad}"], "--cluster="),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_file_that_is_not_utf8_is_one_line_naming_the_flag_and_the_fix(files, reader):
    argv, flag = READERS[reader]
    subs = {
        "{bad}": _w(files, "latin1.toml" if reader == "model" else "latin1", LATIN1),
        "{cpu}": _w(files, "cpu.toml", CPU2),
        "{pl}": _w(files, "pl.json", json.dumps(PLACEMENT)),
        "{jobs}": _w(files, "jobs.csv", "job_id,submit_s,model,global_batch,iterations\nj1,0,tiny,8,5\n"),
        "{out}": str(files.root / "sim.png"),
    }
    if reader == "model":
        subs["{bad}"] = subs["{bad}"].removesuffix(".toml")
    argv = [subs.get(a, a).replace("{bad}", subs["{bad}"]) for a in argv]
    _error(argv, files, flag, "not UTF-8 text (byte 0xe9 on line 1)", "save the", "as UTF-8")
    _nothing_written(files)


def test_a_50_mb_cluster_file_is_refused_at_once_by_its_size(files):
    big = files.root / "big.toml"
    with big.open("wb") as f:
        f.truncate(50 * 2**20)  # sparse: the reader must refuse it by its size, not by reading it
    _error(["plan", "--model", "tiny", "--cluster", str(big)], files, "--cluster=", "50.0 MiB", "4.0 MiB")


def test_a_binary_file_or_a_folder_is_one_line(files):
    png = _w(files, "plan.json", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    _error(["estimate", "--plan", png, "--cluster", MIXED], files, "--plan=", "a binary file (a NUL byte")
    _error(["estimate", "--plan", str(files.root), "--cluster", MIXED], files, "--plan=", "not a file")


def test_utf8_with_a_byte_order_mark_is_read(files):
    cluster = _w(files, "bom.toml", "\ufeff" + Path(MIXED).read_text())
    kind, _ = outcome(["estimate", "--plan", PLAN, "--cluster", cluster], files)
    assert kind == "ok"


# --- every number finite and bounded ---------------------------------------------------------------


def _cluster(files: Files, old: str, new: str) -> str:
    text = Path(MIXED).read_text()
    assert old in text
    return _w(files, "c.toml", text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ('intra_link = "nvlink3"', 'intra_link = {kind = "x", bandwidth_bytes_per_s = inf}', "bandwidth_bytes_per_s=inf"),
        ('intra_link = "nvlink3"', 'intra_link = {kind = "x", bandwidth_bytes_per_s = 1e30}', "bandwidth_bytes_per_s=1e+30"),
        ('num_devices = 4\nintra_link = "nvlink3"', 'num_devices = 4\ndevice_peak_flop_per_s = 1e30\nintra_link = "nvlink3"', "device_peak_flop_per_s=1e+30"),
        ('num_devices = 4\nintra_link = "nvlink3"', 'num_devices = 4\ndevice_memory_bytes = 1000000000000000\nintra_link = "nvlink3"', "device_memory_bytes=1000000000000000: too large"),
        ('num_devices = 4\nintra_link = "nvlink3"', 'num_devices = 4\ndevice_memory_bytes = 800000000000\nintra_link = "nvlink3"', "more than 2x the A100-SXM4-40GB datasheet"),
    ],
    ids=["link-inf", "link-1e30", "peak-1e30", "a100-1e15-bytes", "a100-20x-memory"],
)  # fmt: skip
def test_device_and_link_figures_beyond_any_part_are_refused(files, old, new, needle):
    _error(["plan", "--model", "tiny", "--cluster", _cluster(files, old, new)], files, "nodes.", needle)


def test_discover_of_a_cluster_with_an_inf_link_stores_nothing(files):
    bad = _cluster(files, 'intra_link = "nvlink3"', 'intra_link = {kind = "x", bandwidth_bytes_per_s = inf}')
    _error(["discover", "--cluster", bad], files, "bandwidth_bytes_per_s=inf")
    _nothing_written(files)


@pytest.mark.parametrize(
    ("rate", "cv", "duration", "needle"),
    [
        ("inf", "1", "60", "models.0.rate=inf"),
        ("1e7", "1", "86400", "models.0.rate=10000000.0"),
        ("1e4", "1", "86400", "more than the simulator holds"),
        ("1", "1e9", "60", "models.0.cv=1000000000.0"),
    ],
    ids=["rate-inf", "rate-1e7-day", "requests-over-bound", "cv-1e9"],
)
def test_workload_numbers_are_bounded_before_any_search(files, rate, cv, duration, needle):
    w = _w(files, "w.toml", WORKLOAD.format(rate=rate, cv=cv, duration=duration))
    _error(["serve-plan", "--workload", w, "--cluster", MIXED], files, needle)


def test_gamma_arrivals_with_the_largest_cv_end():
    from planner.limits import MAX_CV
    from planner.serve.workload import ServedModel, Workload, make_trace

    m = ServedModel(name="m", preset="tiny", rate=50, cv=MAX_CV, slo_s=1.0)
    trace = make_trace(Workload(models=(m,), duration_s=600))
    assert 0 < len(trace) and trace.arrival_s[-1] < 600


def test_a_trace_arrival_of_1e12_is_one_line(files):
    argv = ["serve-simulate", "--placement", _w(files, "pl.json", json.dumps(PLACEMENT))]
    argv += ["--cluster", _w(files, "cpu.toml", CPU2), "--trace", _w(files, "t.csv", "model,arrival_s\nm,0\nm,1e12\n")]
    _error(argv, files, "t.csv:3 arrival_s=1000000000000.0", "≤ 86400")
    argv[-1] = _w(files, "day.csv", "model,arrival_s\nm,0\nm,86400\n")  # a whole day is served
    assert outcome(argv, files)[0] == "ok"


def test_calibrate_with_infinite_throughput_is_one_line(files):
    runs = _w(files, "runs.csv", f"{RUNS_HEAD}\n{RUNS_ROW.format(tps='inf')}\n")
    _error(["calibrate", "--runs", runs], files, "row 2, tokens_per_sec='inf'", "finite")
    _nothing_written(files)


@pytest.mark.parametrize("value", ["nan", "inf", "1e400"])
def test_simulate_with_a_non_finite_submit_time_is_one_line(files, value):
    trace = _w(files, "t.csv", f"job_id,submit_s,model,global_batch,iterations\nj1,{value},tiny,8,5\n")
    argv = ["simulate", "--trace", trace, "--cluster", MIXED, "--plot", str(files.root / "p.png")]
    _error(argv, files, "row 2.submit_s=", "finite")
    assert not (files.root / "p.png").exists()


def test_train_refuses_a_learning_rate_that_diverges_at_once(files):
    _error(["train", "--plan", PLAN, "--lr", "1e30"], files, "--lr='1e30'", "less than or equal to 10")
    _nothing_written(files)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--slow-rank", "9", "--slow-factor", "2"], "--slow-rank=9: the plan has 4 rank(s): 0..3"),
        (["--nnodes", "2", "--node-rank", "3", "--no-replan"], "--node-rank=3: the launch has 2 node(s)"),
        (["--resume", "/nonexistent"], "--resume='/nonexistent': no such checkpoint"),
    ],
    ids=["slow-rank", "node-rank", "resume"],
)
def test_a_refused_train_leaves_no_run_row_and_no_run_folder(files, argv, needle):
    _error(["train", "--plan", PLAN, *argv], files, needle)
    _nothing_written(files)


def test_flows_refuse_before_the_run_folder_too(tmp_path):
    """train_flow's own check (a job's runner or a stored plan reaches it without the CLI)."""
    from flows.requests import TrainRequest
    from flows.train import prepare_launch
    from planner.errors import MeshplanError
    from planner.specs.faults import FaultSpec
    from planner.specs.runspec import RunSpec

    runs = tmp_path / "runs"
    for spec, kw in (
        (RunSpec(faults=FaultSpec(slow_rank=7, slow_factor=2.0)), {}),
        (RunSpec(resume=str(tmp_path / "nope")), {}),
        (RunSpec(), {"nnodes": 2, "node_rank": 2, "nproc_per_node": 2}),
    ):
        r = TrainRequest(plan_path=PLAN, spec=spec, runs_dir=str(runs), replan=False, **kw)
        with pytest.raises(MeshplanError):
            prepare_launch(str(tmp_path / "m.duckdb"), r, "r1")
    assert not runs.exists()


def test_submit_refuses_the_model_plan_refuses(files):
    model = ["--model", "custom", "--layers", "10000", "--hidden", "1000000", "--heads", "8"]
    for argv in (
        ["submit", *model, "--global-batch", "8", "--iterations", "3"],
        ["plan", *model, "--cluster", MIXED],
    ):
        _error(argv, files, "--layers=10000", "parameters, more than 1e+13")
    assert not files.db.exists()


@pytest.mark.parametrize(
    ("line", "needle"),
    [("hidden = 65", "hidden=65: must be divisible by num_heads=4"), ("hidden = -3", "hidden=-3: too small")],
)
def test_a_model_file_with_a_bad_field_names_the_file_and_the_key(files, line, needle):
    """ModelSpec's own checks (divisibility) and its field bounds both name the file and the key as
    written in it (`hidden`, not the config section's `model.hidden`)."""
    text = 'family = "llama"\nnum_layers = 4\nnum_heads = 4\nvocab_size = 1000\nseq_len = 64\n' + line + "\n"
    model = _w(files, "mine.toml", text)
    for argv in (
        ["plan", "--model", model, "--cluster", MIXED],
        ["submit", "--model", model, "--global-batch", "8", "--iterations", "3"],
    ):
        _error(argv, files, f"error: {model}: {needle}")
    assert not files.db.exists()


def test_a_bad_set_value_is_refused_beside_the_option_that_sets_the_same_field(files):
    argv = ["--set", "search.global_batch=abc", "plan", "--model", "tiny", "--cluster", MIXED, "--global-batch", "8"]
    _error(argv, files, "search.global_batch='abc'", "valid integer")


def test_jobs_refuses_an_unknown_state_listing_the_states(files):
    _error(["jobs", "--state", "exploded"], files, "--state='exploded'", "queued, running")


def test_db_returns_at_most_the_row_cap_with_a_note(files, capsys):
    from planner.limits import MAX_DB_ROWS

    kind, jid = outcome(["submit", "--model", "tiny", "--global-batch", "8", "--iterations", "3"], files)
    assert kind == "ok"
    from cli.main import run_cli

    rc = run_cli(["--state-dir", str(files.state), "db", "select * from range(2000000)", "--format", "csv"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert len(out.strip().splitlines()) == MAX_DB_ROWS + 1  # the header and the capped rows
    assert f"note: showing the first {MAX_DB_ROWS:,} rows" in err


def test_compare_says_faster_or_slower_with_a_ratio_above_one():
    from cli.commands.compare import speed_sentence

    assert speed_sentence(0.87) == "b is 1.15× slower than a per step (a step of b takes 115% of a's)"
    assert speed_sentence(2.0).startswith("b is 2.00× faster")
    assert speed_sentence(1.001) == "b and a take the same time per step"


def test_estimate_notes_a_plan_made_for_another_cluster_and_refuses_one_too_big(files, capsys):
    from cli.main import run_cli

    doc = {**PLAN_V1, "provenance": {"algorithm": "x", "cluster_fingerprint": "0123456789abcdef"}}
    plan = _w(files, "p.json", json.dumps(doc))
    assert run_cli(["--state-dir", str(files.state), "estimate", "--plan", plan, "--cluster", MIXED]) == 0
    text = " ".join(capsys.readouterr().out.split())  # rich wraps at 80 columns
    assert "note: the plan was made for cluster 'golden-4xT4' (fingerprint 0123456789abcdef)" in text, text
    _error(["estimate", "--plan", PLAN, "--cluster", _w(files, "cpu.toml", CPU2)], files, "device_ids=2", "0..1")


def test_plan_out_never_overwrites_an_input(files):
    cluster = _w(files, "mine.toml", Path(MIXED).read_text())
    before = Path(cluster).read_bytes()
    _error(["plan", "--model", "tiny", "--cluster", cluster, "--out", cluster], files, "--out=", "an input")
    assert Path(cluster).read_bytes() == before
    _error(["plan", "--model", "tiny", "--cluster", cluster, "--out", str(files.root)], files, "--out=", "a folder")


def test_db_stops_a_statement_past_its_time_limit(files, monkeypatch):
    import planner.limits

    kind, _ = outcome(["submit", "--model", "tiny", "--global-batch", "8", "--iterations", "3"], files)
    assert kind == "ok"
    monkeypatch.setattr(planner.limits, "MAX_DB_QUERY_S", 0.5)  # 60 s in use; read at each call
    sql = "select count(*) from range(1000000000000)"
    _error(["db", sql], files, "ran past 0.5 s and was stopped", "add a WHERE or LIMIT")
