"""Calibration that cannot hurt (flows.calibrate.calibrate_runtime, in process on a DuckDB file): an
impossible throughput, a fit that does not beat the prior out of sample, one run, duplicates and rows
without a time each give one line naming why, and store nothing."""

from pathlib import Path

import pytest

from flows.calibrate import _price, calibrate_runtime, fit_runs
from planner.cost.runtimes import PRIOR_FIGURES, profile_named
from planner.errors import MeshplanError
from planner.measure.profiles import ProfileTable
from planner.measure.runs_file import read_runs
from storage.db import query
from storage.pricing import PricingInputs

HEAD = "run_id,layers,hidden,heads,seq_len,vocab,global_batch,micro_batch,tp,pp,dp,gpu,num_gpus,gpus_per_node,iteration_time_s"
CONFIGS = [  # (run_id, micro_batch, tp, pp, dp) of a 1.3B GPT on 8 A100s
    ("a", 4, 1, 1, 8),
    ("b", 2, 2, 1, 4),
    ("c", 1, 1, 2, 4),
]


def runs_csv(path: Path, times: list[str], configs=CONFIGS) -> Path:
    rows = [
        f"{r},24,2048,16,2048,50304,64,{mb},{tp},{pp},{dp},A100-SXM4-80GB,8,8,{t}"
        for (r, mb, tp, pp, dp), t in zip(configs, times, strict=True)
    ]
    path.write_text("\n".join([HEAD, *rows]) + "\n")
    return path


def stored(db: Path) -> int:
    return query(db, "SELECT count(*) AS n FROM runtime_calibrations")["n"][0] if db.exists() else 0


def refused(tmp_path: Path, csv: Path) -> str:
    db = tmp_path / "m.duckdb"
    with pytest.raises(MeshplanError) as err:
        calibrate_runtime(db, "megatron", csv, None)
    assert stored(db) == 0
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def prior_steps(csv: Path) -> list[float]:
    prof = profile_named("megatron")
    out = []
    for r in read_runs(csv.read_text()).runs:
        inp = PricingInputs(r.cluster, ProfileTable(()), "estimates", None, r.plan.dtype, None)
        out.append(_price(r.plan, r.model, inp, prof, PRIOR_FIGURES, "megatron").step_time_s)
    return out


def test_an_impossible_throughput_is_a_bad_row(tmp_path):
    csv = runs_csv(tmp_path / "r.csv", ["2.9", "3.4", "3.6"])
    lines = csv.read_text().replace(",iteration_time_s", ",iteration_time_s,tokens_per_sec").splitlines()
    lines = [lines[0], *(f"{x}," for x in lines[1:]), "d,24,2048,16,2048,50304,64,4,1,1,8,A100-SXM4-80GB,8,8,,1e300"]
    csv.write_text("\n".join(lines) + "\n")
    msg = refused(tmp_path, csv)
    assert msg.startswith("runs file row 5, tokens_per_sec='1e300'") and "MFU" in msg, msg


def test_a_fit_that_does_not_beat_the_prior_out_of_sample_is_not_kept(tmp_path):
    csv = runs_csv(tmp_path / "r.csv", ["1", "1", "1"])
    # measured = the prior's price × (0.8, 1.25, 1.0): the prior is right on average, each fit on two
    # runs is pulled away from the third
    prior = prior_steps(csv)
    csv = runs_csv(tmp_path / "r.csv", [f"{p * f:.6f}" for p, f in zip(prior, (0.8, 1.25, 1.0), strict=True)])
    msg = refused(tmp_path, csv)
    assert "A100-SXM4-80GB/megatron: fit not kept, its leave-one-out MAPE" in msg and "nothing stored" in msg, msg
    # the same runs 20 % slower than the prior throughout: kept, stored, before/after reported
    csv = runs_csv(tmp_path / "r.csv", [f"{p * 1.2:.6f}" for p in prior])
    (fit,) = calibrate_runtime(tmp_path / "m.duckdb", "megatron", csv, None)
    assert fit["mape_cv"] < fit["mape_before"] and fit["mape_after"] < fit["mape_before"]
    assert stored(tmp_path / "m.duckdb") == 1


def test_one_run_and_duplicates_are_too_few(tmp_path):
    one = runs_csv(tmp_path / "one.csv", ["2.9"], CONFIGS[:1])
    assert "A100-SXM4-80GB/megatron: 1 distinct run, calibration needs at least 3" in refused(tmp_path, one)
    dup = runs_csv(tmp_path / "dup.csv", ["2.9", "3.0", "3.4"], [CONFIGS[0], ("a2", *CONFIGS[0][1:]), CONFIGS[1]])
    assert "2 distinct runs, calibration needs at least 3" in refused(tmp_path, dup)


def test_rows_without_a_time_are_skipped_and_named(tmp_path):
    csv = runs_csv(tmp_path / "r.csv", ["", "", "3.6"])
    msg = refused(tmp_path, csv)
    assert "1 distinct run" in msg and "skipped 2 rows without iteration_time_s or tokens_per_sec: 2 (a), 3 (b)" in msg


def test_a_fixed_cost_is_never_fitted_below_zero(tmp_path):
    # runs faster than priced: the per-micro-batch cost (the CPU ranks' only fitted figure) stays 0
    csv = runs_csv(tmp_path / "r.csv", ["1", "1", "1"])
    runs = read_runs(runs_csv(tmp_path / "r.csv", [f"{p * 0.8:.6f}" for p in prior_steps(csv)]).read_text()).runs
    cases = [
        (
            r.run_id,
            r.plan,
            r.model,
            PricingInputs(r.cluster, ProfileTable(()), "estimates", None, "bf16", None),
            r.measured_s,
        )
        for r in runs
    ]
    fig, before, after = fit_runs(cases, "megatron", gpu=False)
    assert fig.microbatch_s == 0.0 and after == pytest.approx(before)
