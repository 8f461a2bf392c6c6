"""Tokens/s over time with and without live re-planning, one rank slowed 1.5×, 2× and 4×.

For each factor F it trains the same dp=4 plan on 4 gloo CPU ranks twice through train_flow —
once under the straggler monitor (`replan=True`), once without — with rank 1 slowed F× from step
S. It reports the detection step and delay, the factor estimate, the action taken, and the
measured tokens/s before the slowdown and over the steps after the switch in both runs (same
steps), plus a PNG of the per-step tokens/s timelines.

    OMP_NUM_THREADS=1 .venv/bin/python bench/straggler.py [--factors 1.5 2 4] [--steps 60] [--out bench/out]

On a 2-core machine 4 ranks oversubscribe the cores: absolute tokens/s are smoke-test numbers;
the with/without ratio on the same machine in the same minute is the result.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

SLOW_RANK, FROM_STEP = 1, 15
CFG = {"threshold": 0.3, "window": 10, "persistence_steps": 5, "margin_s": 0.5}
PLAN = {"model": "tiny", "cluster": "cpu", "global_batch_size": 16, "seq_len": 32, "micro_batch_size": 1,
        "schedule": "1f1b", "dtype": "fp32", "batch_shares": [4, 4, 4, 4],
        "stages": [{"layer_start": 0, "layer_end": 4, "device_ids": [0, 1, 2, 3], "dp": 4}]}  # fmt: skip


def timeline(db: str, run_id: str) -> list[tuple[int, float, float]]:
    """(step, wall time since step 0 ended, tokens/s of that step from the ranks' wall clocks)."""
    from storage.db import query

    rows = query(db, "SELECT step, max(wall_time_s) AS t, sum(tokens) FILTER (WHERE stage = 0 AND tp_index = 0) AS tok "
                     "FROM step_metrics WHERE run_id = ? GROUP BY step ORDER BY step", [run_id]).to_dicts()  # fmt: skip
    return [(b["step"], b["t"] - rows[0]["t"], b["tok"] / (b["t"] - a["t"])) for a, b in zip(rows, rows[1:], strict=False)]


def window_tps(db: str, run_id: str, first: int, last: int) -> float:
    from storage.db import query

    r = query(db, "SELECT step, max(wall_time_s) AS t, sum(tokens) FILTER (WHERE stage = 0 AND tp_index = 0) AS tok "
                  "FROM step_metrics WHERE run_id = ? AND step BETWEEN ? AND ? GROUP BY step ORDER BY step",
              [run_id, first - 1, last]).to_dicts()  # fmt: skip
    return sum(x["tok"] for x in r[1:]) / (r[-1]["t"] - r[0]["t"])


def run_pair(tmp: Path, factor: float, steps: int) -> dict:
    from flows.train import train_flow

    db, plan = str(tmp / "m.duckdb"), tmp / "plan.json"
    plan.write_text(json.dumps(PLAN))
    out = {}
    for replan in (True, False):
        run_id = f"f{factor}-{'replan' if replan else 'keep'}"
        t0 = time.perf_counter()
        res = train_flow(db_path=db, plan_path=str(plan), steps=steps, nproc_per_node=4, run_id=run_id,
                         runs_dir=str(tmp / "runs"), checkpoint_every=1000, timeout_s=900, data="synthetic",
                         replan=replan, replan_config=CFG, slow_rank=SLOW_RANK, slow_factor=factor,
                         slow_from_step=FROM_STEP)  # fmt: skip
        out[replan] = {"run_id": run_id, "wall_s": time.perf_counter() - t0, "decisions": res["decisions"]}
    acted = [d for d in out[True]["decisions"] if d["acted"]]
    first = out[True]["decisions"][0] if out[True]["decisions"] else None
    det = next((d for d in first["detections"] if d["rank"] == SLOW_RANK), None) if first else None
    switch = acted[0]["step"] + 1 if acted else FROM_STEP + 5
    return {
        "factor": factor, "db": db, "detected_at": det["detected_at_step"] if det else None,
        "factor_estimate": det["factor"] if det else None, "action": acted[0]["chosen_action"] if acted else "keep",
        "switch_step": switch if acted else None,
        "healthy_tps": window_tps(db, out[True]["run_id"], 3, FROM_STEP - 1),
        "after_replan_tps": window_tps(db, out[True]["run_id"], switch + 1, steps - 1),
        "after_keep_tps": window_tps(db, out[False]["run_id"], switch + 1, steps - 1),
        "timelines": {k: timeline(db, v["run_id"]) for k, v in (("replan", out[True]), ("keep", out[False]))},
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        for name, style in (("keep", "tab:red"), ("replan", "tab:blue")):
            pts = r["timelines"][name]
            ax.plot([p[0] for p in pts], [p[2] for p in pts], color=style, label=f"{name}", lw=1.2)
        ax.axvline(FROM_STEP, color="grey", ls=":", label=f"rank {SLOW_RANK} slowed {r['factor']}×")
        if r["detected_at"] is not None:
            ax.axvline(r["detected_at"], color="tab:green", ls="--", label=f"detected (step {r['detected_at']})")
        ax.set_title(f"slow factor {r['factor']}×")
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("tokens/s (per step)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factors", type=float, nargs="+", default=[1.5, 2.0, 4.0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    a = ap.parse_args()
    home = tempfile.mkdtemp(prefix="meshplan-bench-")
    os.environ.update(PREFECT_HOME=home, PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
                      PREFECT_LOGGING_LEVEL="ERROR", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120")  # fmt: skip
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    a.out.mkdir(parents=True, exist_ok=True)
    results = [run_pair(Path(tempfile.mkdtemp(prefix=f"f{f}-", dir=home)), f, a.steps) for f in a.factors]
    lines = ["| slow factor | detected at step (delay) | factor estimate | action (switch step) | healthy tok/s "
             "| after switch: re-plan tok/s | after switch: keep tok/s | gain |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        delay = f"{r['detected_at']} (+{r['detected_at'] - FROM_STEP})" if r["detected_at"] is not None else "—"
        est = f"{r['factor_estimate']:.2f}" if r["factor_estimate"] else "—"
        lines.append(f"| {r['factor']}× | {delay} | {est} | {r['action']} ({r['switch_step']}) | {r['healthy_tps']:.0f} "
                     f"| {r['after_replan_tps']:.0f} | {r['after_keep_tps']:.0f} "
                     f"| {r['after_replan_tps'] / r['after_keep_tps']:.2f}× |")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    (a.out / "straggler.md").write_text(table + "\n")
    plot(results, a.out / "straggler.png")
    print(f"plot: {a.out / 'straggler.png'}")


if __name__ == "__main__":
    main()
