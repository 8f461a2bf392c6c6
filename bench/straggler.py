"""Tokens/s over time with and without live re-planning, one rank slowed 1.5×, 2× and 4×.

For each factor F it trains the same dp=4 plan on 4 gloo CPU ranks twice through train_flow —
once under the straggler monitor (`replan=True`), once without — with rank 1 slowed F× from step
S. It reports the detection step and delay, the factor estimate, the action taken, and the
measured tokens/s before the slowdown and over the steps after the switch in both runs (same
steps), plus a PNG of the per-step tokens/s timelines.

    OMP_NUM_THREADS=1 .venv/bin/python bench/straggler.py [--factors 1.5 2 4] [--steps 60] [--out bench/out]

On a 2-core machine 4 ranks oversubscribe the cores: absolute tokens/s are smoke-test numbers;
the with/without ratio on the same machine in the same minute is the result. "Gain raw" is
after-switch tokens/s with re-planning over that without, over the same steps; "drift-corrected"
divides each by its own run's healthy tokens/s (steps 3..S−1), which cancels a load change
*between* the two runs but not one within a run. Both mean something only while nothing else
runs un-niced on the machine: another job's ranks make the healthy ranks real stragglers
(false detections, measured) and change the injected factor relative to its peers
(worker/faults.py). The whole bench (6 runs of 60 steps) takes ~3.5 min on 2 idle cores.
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
# 16 samples per rank and step, as in tests/flows/test_replan_flow.py: with 4 the step is ~30 % all-reduce,
# control broadcast and Python here, with 8 ~20 %, with 16 ~11 %, which no batch re-split can win back
PLAN = {
    "model": "tiny",
    "cluster": "cpu",
    "global_batch_size": 64,
    "seq_len": 32,
    "micro_batch_size": 1,
    "schedule": "1f1b",
    "dtype": "fp32",
    "batch_shares": [16, 16, 16, 16],
    "stages": [{"layer_start": 0, "layer_end": 4, "device_ids": [0, 1, 2, 3], "dp": 4}],
}


def _steps(db: str, run_id: str) -> list[dict]:
    """Per step: the last rank's wall clock when it finished, tokens trained, and the switch action."""
    from storage.db import query

    # the final step's row also holds the final checkpoint save (~1 s): not a training step's time
    return query(
        db,
        "SELECT step, max(wall_time_s) AS t, CAST(sum(tokens) FILTER (WHERE stage = 0 AND tp_index = 0) AS DOUBLE) AS tok, "
        "max(switch_action) AS switch FROM step_metrics WHERE run_id = ? GROUP BY step ORDER BY step",
        [run_id],
    ).to_dicts()[:-1]


def timeline(steps: list[dict], smooth: int = 5) -> list[tuple[int, float, float]]:
    """(step, seconds since step 0 ended, tokens/s over the last `smooth` steps): single steps swing ±40 % here."""
    out = []
    for i in range(smooth, len(steps)):
        a, b = steps[i - smooth], steps[i]
        out.append(
            (
                b["step"],
                b["t"] - steps[0]["t"],
                sum(x["tok"] for x in steps[i - smooth + 1 : i + 1]) / (b["t"] - a["t"]),
            )
        )
    return out


def window_tps(steps: list[dict], first: int, last: int) -> float:
    """Measured tokens/s over steps [first, last]: tokens / wall time from the end of step first−1 to that of last."""
    by = {x["step"]: x for x in steps}
    return sum(by[s]["tok"] for s in range(first, last + 1)) / (by[last]["t"] - by[first - 1]["t"])


def run_pair(tmp: Path, factor: float, steps: int) -> dict:
    """Train the same plan twice with rank SLOW_RANK slowed `factor`× from FROM_STEP: re-planning on, then off."""
    from flows.requests import TrainRequest
    from flows.train import train_flow
    from planner.specs.faults import FaultSpec
    from planner.specs.runspec import RunSpec

    db, plan = str(tmp / "m.duckdb"), tmp / "plan.json"
    plan.write_text(json.dumps(PLAN))
    out = {}
    for replan in (True, False):
        run_id = f"f{factor}-{'replan' if replan else 'keep'}"
        t0 = time.perf_counter()
        request = TrainRequest(
            plan_path=str(plan),
            spec=RunSpec(
                steps=steps,
                checkpoint_every=1000,
                data="synthetic",
                optimizer="sgd",
                lr=0.05,
                faults=FaultSpec(slow_rank=SLOW_RANK, slow_factor=factor, slow_from_step=FROM_STEP),
            ),
            nproc_per_node=4,
            runs_dir=str(tmp / "runs"),
            timeout_s=900,
            replan=replan,
            replan_config=CFG,
        )
        res = train_flow(db, request, run_id).model_dump()
        out[replan] = {**res, "wall_s": time.perf_counter() - t0, "steps": _steps(db, run_id)}
    on, off = out[True], out[False]
    acted = [d for d in on["decisions"] if d["acted"]]
    first = on["decisions"][0] if on["decisions"] else None
    det = next((d for d in first["detections"] if d["rank"] == SLOW_RANK), None) if first else None
    final = next((d for d in on["final_detections"] if d["rank"] == SLOW_RANK and d["kind"] == "compute"), None)
    # the step the ranks switched at (they poll control.json at step boundaries, so after the decision)
    switch = next((x["step"] for x in on["steps"] if x["switch"]), None)
    after = (switch if switch is not None else FROM_STEP + 10) + 1  # same steps in both runs
    healthy_on, healthy_off = window_tps(on["steps"], 3, FROM_STEP - 1), window_tps(off["steps"], 3, FROM_STEP - 1)
    after_on, after_off = window_tps(on["steps"], after, steps - 2), window_tps(off["steps"], after, steps - 2)
    return {
        "factor": factor,
        "detected_at": det["detected_at_step"] if det else None,
        "factor_decided": det["factor"] if det else None,
        "factor_final": final["factor"] if final else None,
        "action": acted[0]["chosen_action"] if acted else "keep",
        "switch_step": switch,
        "shares": json.loads(acted[0]["new_plan_json"])["batch_shares"] if acted else PLAN["batch_shares"],
        "healthy_tps": (healthy_on, healthy_off),
        "after_replan_tps": after_on,
        "after_keep_tps": after_off,
        "gain_raw": after_on / after_off,
        "gain": (after_on / healthy_on) / (after_off / healthy_off),
        "wall_s": (on["wall_s"], off["wall_s"]),
        "timelines": {"replan": timeline(on["steps"]), "keep": timeline(off["steps"])},
        "marks": {
            k: next((t for s, t, _ in timeline(on["steps"], 1) if s == v), None)
            for k, v in (
                ("slowed", FROM_STEP),
                ("detected", det["detected_at_step"] if det else None),
                ("switch", switch),
            )
        },
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        for name, color in (("keep", "tab:red"), ("replan", "tab:blue")):
            pts = r["timelines"][name]
            ax.plot(
                [p[1] for p in pts],
                [p[2] for p in pts],
                color=color,
                lw=1.2,
                label="re-planning" if name == "replan" else "no re-planning",
            )
        # markers at the re-planning run's wall clock (the other run's onset is within a second or two)
        for key, style, label in (
            ("slowed", ":", f"rank {SLOW_RANK} slowed {r['factor']}× (step {FROM_STEP})"),
            ("detected", "--", f"detected (step {r['detected_at']})"),
            ("switch", "-", f"switched (step {r['switch_step']})"),
        ):
            if r["marks"][key] is not None:
                ax.axvline(
                    r["marks"][key], color="grey" if key == "slowed" else "tab:green", ls=style, lw=0.9, label=label
                )
        ax.set_title(
            f"slow factor {r['factor']}×: gain {r['gain_raw']:.2f}× (drift-corrected {r['gain']:.2f}×)", fontsize=9
        )
        ax.set_xlabel("seconds since step 0")
        ax.legend(fontsize=7, loc="lower left")
    axes[0][0].set_ylabel("tokens/s (rolling 5 steps)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: list[dict]) -> str:
    lines = [
        "| slow factor | detected at step (delay) | factor: decided / final | action (switch step) → shares "
        "| healthy tok/s (re-plan, keep run) | after switch: re-plan tok/s | after switch: keep tok/s "
        "| gain raw | gain drift-corrected |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v: f"{v:.2f}" if v is not None else "—"  # noqa: E731
    for r in results:
        delay = f"{r['detected_at']} (+{r['detected_at'] - FROM_STEP})" if r["detected_at"] is not None else "—"
        lines.append(
            f"| {r['factor']}× | {delay} | {fmt(r['factor_decided'])} / {fmt(r['factor_final'])} "
            f"| {r['action']} ({r['switch_step']}) → {r['shares']} "
            f"| {r['healthy_tps'][0]:.0f}, {r['healthy_tps'][1]:.0f} | {r['after_replan_tps']:.0f} "
            f"| {r['after_keep_tps']:.0f} | {r['gain_raw']:.2f}× | {r['gain']:.2f}× |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factors", type=float, nargs="+", default=[1.5, 2.0, 4.0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    a = ap.parse_args()
    home = tempfile.mkdtemp(prefix="meshplan-bench-")
    os.environ.update(
        PREFECT_HOME=home,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="1",
        PREFECT_LOGGING_LEVEL="ERROR",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120",
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = [run_pair(Path(tempfile.mkdtemp(prefix=f"f{f}-", dir=home)), f, a.steps) for f in a.factors]
    text = table(results)
    print(text)
    print(f"{len(results) * 2} runs in {time.perf_counter() - t0:.0f} s; load average {os.getloadavg()}")
    (a.out / "straggler.md").write_text(text + "\n")
    (a.out / "straggler.json").write_text(json.dumps(results, indent=1))
    plot(results, a.out / "straggler.png")
    print(f"plot: {a.out / 'straggler.png'}")


if __name__ == "__main__":
    main()
