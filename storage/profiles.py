"""Layer profiles in DuckDB: upsert measured and estimated rows, load them as a planner ProfileTable.

Rows are keyed by everything that changes a measurement (see schema/0003_profiles.sql), and every
write is an `INSERT … ON CONFLICT DO UPDATE` inside one transaction, so ingesting the same profiler
output twice (a retried task) leaves exactly one row per key. Estimates carry torch_version '' and
so never overwrite a measurement; `load_profile_table` lets measured rows win (ProfileTable.add).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.measure.calibrate import OPTIMIZER_LAYOUTS
from planner.measure.profiles import LayerProfile, ProfileKey, ProfileTable
from planner.specs.model import ModelSpec
from storage.db import connect

if TYPE_CHECKING:  # polars is imported by the reads that return frames (duckdb's .pl()), not by `meshplan plan`
    import polars as pl

KEY_COLUMNS = (
    "model_fingerprint",
    "device_kind",
    "layer_kind",
    "micro_batch_size",
    "seq_len",
    "tp",
    "dtype",
    "recompute",
    "torch_version",
)
VALUE_COLUMNS = (
    "model_name",
    "forward_s",
    "backward_s",
    "forward_spread_s",
    "backward_spread_s",
    "param_bytes",
    "activation_bytes",
    "workspace_bytes",
    "achieved_flop_per_s",
    "estimated",
    "efficiency",
    "efficiency_source",
    "repeats",
    "timing_method",
    "measured_at",
    "tp_comm_included",
)
COLUMNS = KEY_COLUMNS + VALUE_COLUMNS
ESTIMATE_TORCH_VERSION = ""

_UPSERT = (
    f"INSERT INTO layer_profiles ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)}) "
    f"ON CONFLICT ({', '.join(KEY_COLUMNS)}) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in VALUE_COLUMNS)
)


def _row_tuple(row: dict[str, Any]) -> tuple:
    missing = [
        c
        for c in KEY_COLUMNS
        + ("forward_s", "backward_s", "param_bytes", "activation_bytes", "workspace_bytes", "estimated", "measured_at")
        if row.get(c) is None
    ]
    if missing:
        raise ValueError(f"profile row lacks {missing}: {row}")
    return tuple(bool(row.get(c)) if c == "tp_comm_included" else row.get(c) for c in COLUMNS)


def _upsert_all(db_path: str | Path, sql: str, tuples: list[tuple]) -> int:
    """Run one upsert statement over `tuples` in one transaction (all rows or none); returns how many."""
    if not tuples:
        return 0
    with connect(db_path) as con:
        con.execute("BEGIN TRANSACTION")
        try:
            con.executemany(sql, tuples)
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
    return len(tuples)


def upsert_profiles(db_path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Insert or update rows (dicts with COLUMNS; extra keys ignored) in one transaction; returns how many."""
    return _upsert_all(db_path, _UPSERT, [_row_tuple(r) for r in rows])


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a profiler JSONL file; a torn last line (the profiler died mid-write) is skipped."""
    rows = []
    lines = Path(path).read_text().splitlines() if Path(path).exists() else []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise
    return rows


def ingest_jsonl(db_path: str | Path, path: str | Path) -> int:
    """Upsert every row of a profiler output file; idempotent, so a retried ingest duplicates nothing."""
    return upsert_profiles(db_path, read_jsonl(path))


def estimate_rows(
    model: ModelSpec, profiles: Iterable[LayerProfile], efficiency_source: str, now: dt.datetime | None = None
) -> list[dict[str, Any]]:
    """Storage rows for catalog estimates, flagged `estimated` with the efficiency they used."""
    stamp = (now or dt.datetime.now(dt.UTC)).isoformat()
    out = []
    for p in profiles:
        k = p.key
        out.append(
            {
                "model_fingerprint": model.fingerprint(),
                "device_kind": k.device_kind,
                "layer_kind": k.layer_kind,
                "micro_batch_size": k.micro_batch_size,
                "seq_len": k.seq_len,
                "tp": k.tp,
                "dtype": k.dtype,
                "recompute": k.recompute,
                "torch_version": ESTIMATE_TORCH_VERSION,
                "model_name": model.name,
                "forward_s": p.forward_s,
                "backward_s": p.backward_s,
                "forward_spread_s": 0.0,
                "backward_spread_s": 0.0,
                "param_bytes": p.param_bytes,
                "activation_bytes": p.activation_bytes,
                "workspace_bytes": p.workspace_bytes,
                "achieved_flop_per_s": None,
                "estimated": True,
                "efficiency": p.efficiency,
                "efficiency_source": efficiency_source,
                "repeats": 0,
                "timing_method": "estimate:roofline",
                "measured_at": stamp,
            }
        )
    return out


def profile_frame(db_path: str | Path, model: ModelSpec | None = None) -> pl.DataFrame:
    """All stored rows (of one model if given) as a polars frame, for inspection and reports."""
    where, params = ("WHERE model_fingerprint = ?", [model.fingerprint()]) if model else ("", [])
    with connect(db_path) as con:
        sql = f"SELECT * FROM layer_profiles {where} ORDER BY device_kind, layer_kind, seq_len, tp, micro_batch_size, recompute"
        return con.sql(sql, params=params).pl() if params else con.sql(sql).pl()


def load_profile_table(
    db_path: str | Path, model: ModelSpec, device_kinds: Sequence[str] | None = None
) -> ProfileTable:
    """The model's profiles (every torch version; the newest measurement of a key wins, measured beats estimated)."""
    if not Path(db_path).exists():
        return ProfileTable()
    sql = "SELECT * FROM layer_profiles WHERE model_fingerprint = ?"
    params: list[Any] = [model.fingerprint()]
    if device_kinds is not None:
        if not device_kinds:
            return ProfileTable()
        sql += f" AND device_kind IN ({', '.join('?' for _ in device_kinds)})"
        params += list(device_kinds)
    with connect(db_path) as con:
        rel = con.sql(sql + " ORDER BY estimated DESC, measured_at", params=params)
        names, rows = rel.columns, rel.fetchall()  # plain rows: no polars on the search's path
    return ProfileTable(_profile(dict(zip(names, r, strict=True))) for r in rows)


def _profile(r: dict[str, Any]) -> LayerProfile:
    key = ProfileKey(
        r["device_kind"], r["layer_kind"], r["micro_batch_size"], r["seq_len"], r["tp"], r["recompute"], r["dtype"]
    )
    return LayerProfile(
        key=key,
        forward_s=r["forward_s"],
        backward_s=r["backward_s"],
        param_bytes=r["param_bytes"],
        activation_bytes=r["activation_bytes"],
        workspace_bytes=r["workspace_bytes"],
        estimated=r["estimated"],
        efficiency=r["efficiency"],
        forward_spread_s=r["forward_spread_s"],
        backward_spread_s=r["backward_spread_s"],
        tp_comm_included=bool(r.get("tp_comm_included")),
    )


def missing_keys(
    db_path: str | Path, keys: Iterable[ProfileKey], model: ModelSpec, torch_version: str | None = None
) -> list[ProfileKey]:
    """Keys with no *measured* row for this model (and torch version, when given): what must be profiled."""
    keys = list(keys)
    if not Path(db_path).exists() or not keys:
        return keys
    sql = (
        "SELECT device_kind, layer_kind, micro_batch_size, seq_len, tp, recompute, dtype FROM layer_profiles "
        "WHERE model_fingerprint = ? AND NOT estimated"
    )
    params: list[Any] = [model.fingerprint()]
    if torch_version is not None:
        sql += " AND torch_version = ?"
        params.append(torch_version)
    with connect(db_path) as con:
        have = {ProfileKey(*row) for row in con.execute(sql, params).fetchall()}
    return [k for k in keys if k not in have]


# ---- optimizer step time per parameter (schema/0009_optimizer_steps.sql) -------------------------

OPTIMIZER_KEY_COLUMNS = ("model_fingerprint", "device_kind", "layout", "num_ranks", "torch_version")
OPTIMIZER_VALUE_COLUMNS = ("model_name", "optimizer", "s_per_param", "measured_at")
OPTIMIZER_COLUMNS = OPTIMIZER_KEY_COLUMNS + OPTIMIZER_VALUE_COLUMNS

_UPSERT_OPTIMIZER = (
    f"INSERT INTO optimizer_steps ({', '.join(OPTIMIZER_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in OPTIMIZER_COLUMNS)}) "
    f"ON CONFLICT ({', '.join(OPTIMIZER_KEY_COLUMNS)}) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in OPTIMIZER_VALUE_COLUMNS)
)


def _optimizer_tuple(row: dict[str, Any]) -> tuple:
    missing = [c for c in OPTIMIZER_KEY_COLUMNS + ("s_per_param", "measured_at") if row.get(c) is None]
    if missing:
        raise ValueError(f"optimizer step row lacks {missing}: {row}")
    if row["layout"] not in OPTIMIZER_LAYOUTS:
        raise ValueError(f"optimizer step row's layout {row['layout']!r} is not one of {OPTIMIZER_LAYOUTS}")
    values = {**row, "num_ranks": int(row["num_ranks"]), "optimizer": row.get("optimizer") or "adamw"}
    return tuple(values.get(c) for c in OPTIMIZER_COLUMNS)


def upsert_optimizer_profiles(db_path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Insert or update optimizer step rows (dicts with OPTIMIZER_COLUMNS; extra keys ignored) in one
    transaction; returns how many. Idempotent: a retried write leaves one row per key."""
    return _upsert_all(db_path, _UPSERT_OPTIMIZER, [_optimizer_tuple(r) for r in rows])


def load_optimizer_profile(db_path: str | Path, model: ModelSpec, device_kind: str) -> dict[str, float]:
    """{layout: s, …, "num_ranks": n}: seconds per local parameter of one optimizer step of this model
    on `device_kind` per parameter layout, from the newest measurement (across torch versions), and
    how many ranks stepped at once in it; {} if none."""
    if not Path(db_path).exists():
        return {}
    where = "model_fingerprint = ? AND device_kind = ?"
    sql = (
        f"SELECT layout, num_ranks, s_per_param FROM optimizer_steps WHERE {where} "
        f"AND measured_at = (SELECT max(measured_at) FROM optimizer_steps WHERE {where}) ORDER BY num_ranks"
    )
    with connect(db_path) as con:
        rows = con.execute(sql, [model.fingerprint(), device_kind] * 2).fetchall()
    if not rows:
        return {}
    return {**{layout: s for layout, _, s in rows}, "num_ranks": float(rows[-1][1])}


def missing_optimizer_profile(
    db_path: str | Path, model: ModelSpec, device_kind: str, torch_version: str, num_ranks: int = 1
) -> bool:
    """Whether any layout's measurement of this model, device kind, torch version and rank count is missing."""
    if not Path(db_path).exists():
        return True
    sql = (
        "SELECT DISTINCT layout FROM optimizer_steps WHERE model_fingerprint = ? AND device_kind = ? "
        "AND torch_version = ? AND num_ranks = ?"
    )
    with connect(db_path) as con:
        args = [model.fingerprint(), device_kind, torch_version, num_ranks]
        have = {layout for (layout,) in con.execute(sql, args).fetchall()}
    return not set(OPTIMIZER_LAYOUTS) <= have
