"""Plans in DuckDB: upsert searched and baseline plans keyed by (plan fingerprint, search key).

The search key identifies one search (model, cluster, profiles, config and cost model), taken from
the plans' provenance, so re-running a search replaces its rows instead of adding copies.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from planner.measure.profiles import ProfileTable
from planner.specs.plan import Plan, parse_plan_json
from storage.db import connect
from storage.profiles import load_profile_table

if TYPE_CHECKING:  # polars is imported by the reads that return frames (duckdb's .pl()), not by `meshplan plan`
    import polars as pl

_COLUMNS = (
    "plan_fingerprint, search_key, model, cluster, model_fingerprint, cluster_fingerprint, profile_fingerprint, "
    "algorithm, cost_model_version, rank, baseline, step_time_s, tokens_per_s, mfu, peak_memory_bytes, feasible, "
    "bottleneck, pp, dp, num_devices, plan_json"
)


def search_key(plan: Plan) -> str:
    """Id of the search that produced `plan` (provenance minus the algorithm, which baselines differ in)."""
    p = plan.provenance
    blob = "|".join(
        [p.model_fingerprint, p.cluster_fingerprint, p.config_fingerprint, p.profile_fingerprint, p.cost_model_version]
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _row(plan: Plan, key: str, rank: int | None, baseline: str) -> list:
    c = plan.predicted
    p = plan.provenance
    return [
        plan.fingerprint(),
        key,
        plan.model,
        plan.cluster,
        p.model_fingerprint,
        p.cluster_fingerprint,
        p.profile_fingerprint,
        p.algorithm,
        p.cost_model_version,
        rank,
        baseline,
        None if c is None else c.step_time_s,
        None if c is None else c.tokens_per_s,
        None if c is None else c.mfu,
        None if c is None else max(c.peak_memory_bytes),
        None if c is None else c.feasible,
        None if c is None else c.bottleneck,
        plan.pp,
        plan.dp,
        plan.num_devices,
        plan.to_json(),
    ]


def save_plans(
    db_path: str | Path, plans: list[Plan] | tuple[Plan, ...], baselines: dict[str, Plan | None] | None = None
) -> str:
    """Upsert ranked plans (rank 1 = best) and baselines; returns the search key."""
    if not plans:
        raise ValueError("no plans to save")
    key = search_key(plans[0])
    rows = [_row(p, key, i + 1, "") for i, p in enumerate(plans)]
    for name, b in (baselines or {}).items():
        if b is not None:
            rows.append(_row(b, key, None, name))
    marks = ", ".join("?" for _ in _COLUMNS.split(","))
    with connect(db_path) as con:
        con.execute("BEGIN TRANSACTION")
        # a layout that is both searched and a baseline keeps one row: the searched one (ranked)
        seen: set[str] = set()
        for r in rows:
            if r[0] in seen:
                continue
            seen.add(r[0])
            con.execute(f"INSERT OR REPLACE INTO plans ({_COLUMNS}) VALUES ({marks})", r)
        con.execute("COMMIT")
    return key


def plans_frame(db_path: str | Path, key: str | None = None) -> pl.DataFrame:
    """Stored plans (without their JSON), best first; one search when `key` is given."""
    cols = _COLUMNS.replace(", plan_json", "") + ", created_at"
    sql = f"SELECT {cols} FROM plans"
    params = None
    if key is not None:
        sql += " WHERE search_key = ?"
        params = [key]
    with connect(db_path) as con:
        rel = con.sql(sql + " ORDER BY search_key, baseline, rank, step_time_s", params=params)
        return rel.pl()


def load_plan(db_path: str | Path, fingerprint: str, key: str | None = None) -> Plan:
    sql = "SELECT plan_json FROM plans WHERE plan_fingerprint = ?"
    params: list = [fingerprint]
    if key is not None:
        sql += " AND search_key = ?"
        params.append(key)
    with connect(db_path) as con:
        rows = con.execute(sql + " ORDER BY created_at DESC", params).fetchall()
    if not rows:
        raise LookupError(f"no stored plan {fingerprint}")
    return parse_plan_json(rows[0][0], origin=f"plans[{fingerprint}]")


def best_plan(db_path: str | Path, key: str) -> Plan:
    with connect(db_path) as con:
        rows = con.execute(
            "SELECT plan_json FROM plans WHERE search_key = ? AND baseline = '' ORDER BY rank LIMIT 1", [key]
        ).fetchall()
    if not rows:
        raise LookupError(f"no stored plans for search {key}")
    return parse_plan_json(rows[0][0], origin=f"plans[{key}]")


def load_profiles_or_empty(db_path: str | Path, model) -> tuple[ProfileTable, str]:
    """The model's stored profiles and where they came from; no database, no profiles table (the
    profiling stage not run) or an empty table all mean "estimates only"."""
    if not Path(db_path).exists():
        return ProfileTable(), "estimates only (no database)"
    try:
        table = load_profile_table(db_path, model)
    except duckdb.CatalogException:
        return ProfileTable(), "estimates only (no profiles table)"
    measured = sum(1 for r in table if not r.estimated)
    if not len(table):
        return table, "estimates only (no profiles for this model)"
    return table, f"{measured} measured and {len(table) - measured} stored estimated profile rows"
