"""Predicted vs measured on this machine's devices: discovery, a layer profile, short training runs.

    .venv/bin/python bench/gpu_check.py [--device cuda|cpu] [--model gpt2-small] [--plans 3] [--steps 8]

What a session with a CUDA machine runs (under 10 minutes on one H100), and what `--device cpu` runs
the same way on CPU ranks (CUDA hidden; a test runs it small, reporting to its session's Prefect
server through `--prefect-api-url` instead of a temporary server a command). Each step is the real
CLI on a state folder of its own (`--state-dir`, default a temporary one):
1. `meshplan discover` (CPU: `--num-ranks 2`), 2. `meshplan profile --model M`,
3. `meshplan plan --model M --top K`: the ranked plans (on 2+ GPUs they include tp / dp layouts),
4. per plan, three predictions of the step time and peak memory: *catalog* (datasheet roofline,
   no profiles: planner.cost.estimate on the discovered cluster), *profiled* (the stored layer
   profiles and the machine's calibration: what `meshplan estimate` says before any run), and after
   `meshplan train --plan P --steps N` for every plan and `meshplan calibrate` on their telemetry,
   *calibrated* (what `estimate` says after);
5. measured: the median step (slowest rank, first step left out) and the largest memory a rank
   reported, from the run's telemetry.
The table is printed and written to bench/results/gpu_check_<device>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


SETS: list[str] = []  # `--set section.key=value` for every meshplan call (--set of this script)


def cli(
    state: Path, env: dict[str, str], *args: str, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess:
    sets = [x for kv in SETS for x in ("--set", kv)]
    p = subprocess.run(
        [sys.executable, "-m", "cli", "--state-dir", str(state), *sets, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    if check and p.returncode != 0:
        raise SystemExit(f"meshplan {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p


def last_json(text: str):
    """The JSON document a --json command printed last (progress lines may precede it)."""
    for start in (i for i, ch in enumerate(text) if ch in "[{"):
        try:
            return json.loads(text[start:])
        except json.JSONDecodeError:
            continue
    raise ValueError(f"no JSON in {text[-500:]!r}")


def predictions(state: Path, plan_file: Path, model_name: str) -> dict[str, float]:
    """catalog (no profiles, no calibration) and stored-profile predictions, in-process."""
    from flows.queries import price_for_runtime
    from planner.cost import estimate
    from planner.measure.profiles import ProfileTable
    from planner.specs.model import get_model
    from planner.specs.plan import parse_plan_json
    from storage.pricing import pricing_inputs

    db = state / "meshplan.duckdb"
    m = get_model(model_name)
    p = parse_plan_json(plan_file.read_text(), origin=plan_file.name)
    inputs = pricing_inputs(db, m)
    catalog = estimate(p, m, inputs.cluster, ProfileTable())
    priced, label = price_for_runtime(db, p, m, inputs, "meshplan")
    return {
        "catalog_s": catalog.step_time_s,
        "catalog_peak_gib": max(catalog.peak_memory_bytes) / 2**30,
        "predicted_s": priced.step_time_s,
        "predicted_peak_gib": max(priced.peak_memory_bytes) / 2**30,
        "figures": label,
    }


def measured(state: Path, run_id: str) -> tuple[float, float]:
    from storage.db import query

    df = query(
        state / "meshplan.duckdb",
        "SELECT step, max(step_time_s) AS t, max(memory_bytes) AS mem FROM step_metrics WHERE run_id = ? "
        "GROUP BY step ORDER BY step",
        [run_id],
    )
    times = df["t"].to_list()
    times = times[1:] if len(times) > 1 else times
    return sorted(times)[len(times) // 2], max(df["mem"].to_list()) / 2**30


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--model", default=None, help="preset (default: gpt2-small on CUDA, tiny on CPU)")
    ap.add_argument("--plans", type=int, default=3, help="how many ranked plans to train")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=None)
    ap.add_argument("--state-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results")
    ap.add_argument("--set", action="append", default=[], help="section.key=value for every meshplan call")
    ap.add_argument(
        "--prefect-api-url",
        default=None,
        help="a running Prefect server's API for every meshplan call (default: each call starts Prefect's temporary one)",
    )
    args = ap.parse_args(argv)
    SETS[:] = args.set
    cpu = args.device == "cpu"
    model = args.model or ("tiny" if cpu else "gpt2-small")
    gb = args.global_batch or (4 if cpu else 16)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env.pop("PREFECT_API_URL", None)  # a server inherited by accident is not used; one named with the flag is
    if args.prefect_api_url:
        env["PREFECT_API_URL"] = args.prefect_api_url
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device here: run with --device cpu", file=sys.stderr)
            return 2
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    env["PREFECT_HOME"] = str(state / "prefect")
    if cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    t0 = time.monotonic()
    cli(state, env, "discover", *(("--num-ranks", "2") if cpu else ()))
    cli(state, env, "profile", "--model", model)
    ranked = last_json(cli(state, env, "plan", "--model", model, "--global-batch", str(gb), "--json").stdout)
    plans = ranked["plans"][: args.plans]
    rows = []
    for i, plan in enumerate(plans):
        f = state / f"plan{i}.json"
        f.write_text(json.dumps(plan))
        before = predictions(state, f, model)
        out = last_json(
            cli(
                state,
                env,
                "train",
                "--plan",
                str(f),
                "--steps",
                str(args.steps),
                "--data",
                "synthetic",
                "--no-replan",
                "--json",
            ).stdout
        )
        step_s, peak = measured(state, out["run_id"])
        rows.append(
            {
                "plan": i,
                "layout": ranked["ranking"][i].get("layout", ""),
                "file": f,
                **before,
                "step_s": step_s,
                "peak_gib": peak,
            }
        )
    # calibration refuses (storing nothing) with fewer than 3 runs or a fit that does not beat the prior
    # on its own runs: the "calibrated" column then repeats the profiled price, and the line says why
    cal = cli(state, env, "calibrate", check=False)
    refused = cal.stderr.strip().splitlines()[-1] if cal.returncode != 0 and cal.stderr.strip() else ""
    if cal.returncode != 0 and "nothing stored" not in refused:
        raise SystemExit(f"meshplan calibrate failed ({cal.returncode}): {cal.stderr.strip()[-2000:]}")
    for r in rows:
        after = predictions(state, r.pop("file"), model)
        r["calibrated_s"], r["calibrated_figures"] = after["predicted_s"], after["figures"]
    lines = [
        f"# gpu_check ({args.device}, {model}, global batch {gb}, {args.steps} steps), {time.monotonic() - t0:.0f} s",
        "",
        "| plan | layout | catalog s | profiled s | calibrated s | measured s | catalog GiB | profiled GiB | measured GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['plan']} | {r['layout']} | {r['catalog_s']:.4g} | {r['predicted_s']:.4g} | {r['calibrated_s']:.4g} |"
            f" {r['step_s']:.4g} | {r['catalog_peak_gib']:.3g} | {r['predicted_peak_gib']:.3g} | {r['peak_gib']:.3g} |"
        )
    lines.append("")
    lines.append(f"calibration: {rows[0]['calibrated_figures'] if rows else 'none'}")
    if refused:
        lines.append(f"calibration refused: {refused}")
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"gpu_check_{args.device}.md").write_text(text + "\n")
    (args.out / f"gpu_check_{args.device}.json").write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
