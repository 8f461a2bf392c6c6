"""Plans in a real DuckDB file: idempotent upsert, ranks, baselines, round trip."""

from planner.search import search
from planner.specs.cluster import parse_cluster
from planner.specs.model import get_model
from storage.db import connect, migrate, schema_version
from storage.plans import best_plan, load_plan, plans_frame, save_plans


def _result():
    cluster = parse_cluster(
        {
            "name": "c",
            "nodes": [
                {
                    "name": "a",
                    "device": "A100-SXM4-80GB",
                    "num_devices": 4,
                    "intra_link": "nvlink3",
                    "inter_link": "ib-hdr",
                }
            ],
        }
    )
    return search(get_model("gpt2-small"), cluster, global_batch=16, top_k=3)


def test_saving_twice_keeps_one_row_per_plan(tmp_path):
    db = tmp_path / "m.duckdb"
    res = _result()
    key = save_plans(db, res.plans, res.baselines)
    again = save_plans(db, res.plans, res.baselines)
    assert key == again
    frame = plans_frame(db, key)
    searched = frame.filter(frame["baseline"] == "")
    assert searched.height == len(res.plans)
    assert searched["rank"].to_list() == list(range(1, len(res.plans) + 1))
    assert frame.height <= len(res.plans) + 2
    assert schema_version(db) >= 4


def test_stored_plan_round_trips_with_predictions(tmp_path):
    db = tmp_path / "m.duckdb"
    res = _result()
    key = save_plans(db, res.plans, res.baselines)
    best = best_plan(db, key)
    assert best == res.best
    assert best.predicted.step_time_s == res.best.predicted.step_time_s
    assert load_plan(db, res.plans[-1].fingerprint()) == res.plans[-1]


def test_baselines_are_flagged(tmp_path):
    db = tmp_path / "m.duckdb"
    res = _result()
    key = save_plans(db, res.plans, res.baselines)
    names = set(plans_frame(db, key)["baseline"].to_list()) - {""}
    searched = {p.fingerprint() for p in res.plans}
    expected = {n for n, b in res.baselines.items() if b is not None and b.fingerprint() not in searched}
    assert names == expected


def test_migration_is_idempotent(tmp_path):
    db = tmp_path / "m.duckdb"
    with connect(db) as con:
        assert migrate(con) == 0
        con.execute("SELECT count(*) FROM plans").fetchall()
