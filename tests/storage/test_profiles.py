"""Layer profiles in a real DuckDB file: idempotent upserts, estimate flags, measured rows winning."""

import json
import subprocess
import sys

import pytest

from planner.measure.profiles import ProfileKey, estimate_layer
from planner.specs.model import PRESETS
from storage.db import connect
from storage.profiles import (
    estimate_rows,
    ingest_jsonl,
    load_optimizer_profile,
    load_profile_table,
    missing_keys,
    missing_optimizer_profile,
    profile_frame,
    read_jsonl,
    upsert_optimizer_profiles,
    upsert_profiles,
)

TINY = PRESETS["tiny"]
TORCH = "2.13.0+cpu"


def _measured(
    kind="cpu",
    layer="block",
    mbs=1,
    recompute=False,
    forward_s=1e-3,
    torch_version=TORCH,
    dtype="fp32",
    at="2026-12-02T10:00:00+00:00",
):
    return {
        "model_fingerprint": TINY.fingerprint(),
        "device_kind": kind,
        "layer_kind": layer,
        "micro_batch_size": mbs,
        "seq_len": 64,
        "tp": 1,
        "dtype": dtype,
        "recompute": recompute,
        "torch_version": torch_version,
        "model_name": "tiny",
        "forward_s": forward_s,
        "backward_s": 2 * forward_s,
        "forward_spread_s": 1e-5,
        "backward_spread_s": 2e-5,
        "param_bytes": 199936,
        "activation_bytes": 264192,
        "workspace_bytes": 131072,
        "achieved_flop_per_s": 1e9,
        "estimated": False,
        "efficiency": None,
        "repeats": 5,
        "timing_method": "cpu:perf_counter",
        "measured_at": at,
        "host": "ignored extra field",
    }


def _count(db):
    return profile_frame(db).height


def test_retried_ingest_of_the_same_file_leaves_no_duplicates(tmp_path):
    db, f = tmp_path / "m.duckdb", tmp_path / "rows.jsonl"
    rows = [_measured(mbs=b, recompute=r) for b in (1, 2) for r in (False, True)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ingest_jsonl(db, f) == 4
    assert ingest_jsonl(db, f) == 4
    assert _count(db) == 4


def test_upsert_updates_values_of_an_existing_key(tmp_path):
    db = tmp_path / "m.duckdb"
    upsert_profiles(db, [_measured(forward_s=1e-3)])
    upsert_profiles(db, [_measured(forward_s=5e-3, at="2026-12-02T11:00:00+00:00")])
    frame = profile_frame(db)
    assert frame.height == 1 and frame["forward_s"][0] == 5e-3


def test_torn_last_line_is_skipped_and_earlier_rows_kept(tmp_path):
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps(_measured()) + "\n" + '{"device_kind": "cp')
    assert len(read_jsonl(f)) == 1


def test_estimated_rows_are_flagged_with_their_efficiency_and_measured_rows_win(tmp_path):
    db = tmp_path / "m.duckdb"
    key = ProfileKey("A100-SXM4-40GB", "block", 1, 64, 1, False, "bf16")
    est = estimate_layer(TINY, key, 312e12, 1555e9, efficiency=0.41)
    upsert_profiles(db, estimate_rows(TINY, [est], "calibrated on H100-SXM5-80GB (1 rows)"))
    frame = profile_frame(db)
    assert frame["estimated"].to_list() == [True] and frame["efficiency"].to_list() == [0.41]
    assert frame["efficiency_source"][0].startswith("calibrated")
    assert load_profile_table(db, TINY).get(key).estimated

    # A later measurement of the same shape on a real A100 is stored beside it and wins on load.
    upsert_profiles(db, [_measured(kind="A100-SXM4-40GB", dtype="bf16", forward_s=7e-5)])
    table = load_profile_table(db, TINY)
    assert _count(db) == 2 and len(table) == 1
    assert not table.get(key).estimated and table.get(key).forward_s == 7e-5
    # Re-estimating never overwrites the measurement.
    upsert_profiles(db, estimate_rows(TINY, [est], "default"))
    assert not load_profile_table(db, TINY).get(key).estimated


def test_newest_measurement_wins_across_torch_versions(tmp_path):
    db = tmp_path / "m.duckdb"
    upsert_profiles(
        db,
        [
            _measured(torch_version="2.12.0", forward_s=9e-3, at="2026-11-01T00:00:00+00:00"),
            _measured(forward_s=1e-3, at="2026-12-01T00:00:00+00:00"),
        ],
    )
    (row,) = list(load_profile_table(db, TINY))
    assert row.forward_s == 1e-3


def test_missing_keys_ignore_estimates_and_other_torch_versions(tmp_path):
    db = tmp_path / "m.duckdb"
    measured = ProfileKey("cpu", "block", 1, 64, 1, False, "fp32")
    other = ProfileKey("cpu", "block", 2, 64, 1, False, "fp32")
    assert missing_keys(db, [measured, other], TINY) == [measured, other]  # no database yet
    upsert_profiles(db, [_measured()])
    upsert_profiles(db, estimate_rows(TINY, [estimate_layer(TINY, other, 1e12, 1e11)], "default"))
    assert missing_keys(db, [measured, other], TINY, TORCH) == [other]
    assert missing_keys(db, [measured, other], TINY, "2.14.0") == [measured, other]
    assert missing_keys(db, [measured], PRESETS["tiny-llama"], TORCH) == [measured]


def test_load_filters_device_kinds(tmp_path):
    db = tmp_path / "m.duckdb"
    upsert_profiles(db, [_measured(), _measured(kind="T4", dtype="bf16")])
    assert load_profile_table(db, TINY, ["T4"]).device_kinds() == {"T4"}
    assert len(load_profile_table(db, TINY)) == 2


def test_storage_profiles_imports_no_prefect_or_torch():
    code = "import sys, storage.profiles; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert "'prefect'" not in loaded and "'torch'" not in loaded


def _optimizer(layout="plain", s=2e-8, torch_version=TORCH, at="2026-12-02T10:00:00+00:00", kind="cpu", ranks=2):
    return {
        "model_fingerprint": TINY.fingerprint(),
        "device_kind": kind,
        "layout": layout,
        "num_ranks": ranks,
        "torch_version": torch_version,
        "model_name": "tiny",
        "s_per_param": s,
        "measured_at": at,
        "host": "ignored extra field",
    }


def _run(at, ranks=2, torch_version=TORCH, scale=1.0):
    """One measurement's three layouts, sharing its stamp."""
    return [
        _optimizer(layout, s * scale, torch_version, at, ranks=ranks)
        for layout, s in (("plain", 2e-8), ("tp", 6e-8), ("fsdp", 8e-8))
    ]


def test_optimizer_steps_round_trip_upsert_idempotently_and_the_newest_measurement_wins(tmp_path):
    db = tmp_path / "m.duckdb"
    assert load_optimizer_profile(db, TINY, "cpu") == {} and not db.exists()  # no file: nothing, none created
    assert missing_optimizer_profile(db, TINY, "cpu", TORCH, 2)

    first = "2026-12-02T10:00:00+00:00"
    assert upsert_optimizer_profiles(db, [_optimizer(at=first)]) == 1
    assert load_optimizer_profile(db, TINY, "cpu") == {"plain": 2e-8, "num_ranks": 2.0}  # only the stored layout
    assert missing_optimizer_profile(db, TINY, "cpu", TORCH, 2)  # the DTensor layouts are still missing

    assert upsert_optimizer_profiles(db, _run(first)) == 3
    assert upsert_optimizer_profiles(db, _run(first)) == 3  # a retried write duplicates nothing
    with connect(db) as con:
        count, optimizers = con.execute("SELECT count(*), list(DISTINCT optimizer) FROM optimizer_steps").fetchone()
    assert count == 3 and optimizers == ["adamw"]
    assert load_optimizer_profile(db, TINY, "cpu") == {"plain": 2e-8, "tp": 6e-8, "fsdp": 8e-8, "num_ranks": 2.0}
    assert not missing_optimizer_profile(db, TINY, "cpu", TORCH, 2)
    assert missing_optimizer_profile(db, TINY, "cpu", TORCH, 1)  # another rank count is another measurement
    assert missing_optimizer_profile(db, TINY, "cpu", "2.14.0", 2)
    assert missing_optimizer_profile(db, PRESETS["tiny-llama"], "cpu", TORCH, 2)
    assert load_optimizer_profile(db, TINY, "T4") == {}

    # An older one-process measurement changes nothing; a newer one (any torch version) wins whole.
    upsert_optimizer_profiles(db, _run("2026-11-01T00:00:00+00:00", ranks=1, scale=9.0))
    assert load_optimizer_profile(db, TINY, "cpu")["num_ranks"] == 2.0
    upsert_optimizer_profiles(db, _run("2026-12-24T00:00:00+00:00", ranks=1, torch_version="2.14.0", scale=0.5))
    assert load_optimizer_profile(db, TINY, "cpu") == {"plain": 1e-8, "tp": 3e-8, "fsdp": 4e-8, "num_ranks": 1.0}


def test_an_optimizer_step_row_with_an_unknown_layout_is_refused(tmp_path):
    with pytest.raises(ValueError, match="zero3"):
        upsert_optimizer_profiles(tmp_path / "m.duckdb", [_optimizer(layout="zero3")])
