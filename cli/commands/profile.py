"""`meshplan profile`: measure each distinct layer shape here, estimate absent GPUs, show what happened."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.app import app, db_path, load_settings, prefect_env, state

GRID_OPTIONS = ("--mbs", "--seq", "--tp")


def grid_values(tokens: list[str], option: str) -> list[int]:
    """Integers given to `option` as `--mbs 1 2`, `--mbs 1,2`, `--mbs=1,2` or repeated `--mbs 1 --mbs 2`."""
    from planner.errors import MeshplanError

    values: list[int] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok.startswith(option + "="):
            raw = [tok.split("=", 1)[1]]
        elif tok == option:
            raw = []
            while i < len(tokens) and not tokens[i].startswith("-"):
                raw.append(tokens[i])
                i += 1
        else:
            continue
        for part in ",".join(raw).split(","):
            if part.strip():
                if not part.strip().isdigit():
                    raise MeshplanError(option, part, f"must be positive integers, e.g. {option} 1 2 or {option} 1,2")
                values.append(int(part))
    return values


def _grid(ctx: typer.Context, given: dict[str, list[str] | None]) -> dict[str, list[int]]:
    """The grid options, reading the raw command line when values were space-separated (`--mbs 1 2`)."""
    from planner.errors import MeshplanError

    if ctx.args:
        argv = sys.argv[1:]
        if "profile" not in argv:
            raise MeshplanError("profile", " ".join(ctx.args), "unexpected arguments; write lists as --mbs 1,2")
        tokens = argv[argv.index("profile") + 1 :]
        return {opt: grid_values(tokens, opt) for opt in GRID_OPTIONS}
    return {opt: grid_values([t for v in (given[opt] or []) for t in (opt, v)], opt) for opt in GRID_OPTIONS}


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def profile(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", help="model preset name (default: config `model`)")] = None,
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="cluster TOML; kinds not here are estimated")
    ] = None,
    mbs: Annotated[list[str] | None, typer.Option("--mbs", help="micro-batch sizes: --mbs 1 2 or --mbs 1,2")] = None,
    seq: Annotated[list[str] | None, typer.Option("--seq", help="sequence lengths (default: the model's)")] = None,
    tp: Annotated[list[str] | None, typer.Option("--tp", help="tensor-parallel degrees: --tp 1 2")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
) -> None:
    """Profile layers (forward/backward time, memory) into the database; estimate devices not present."""
    grid = _grid(ctx, {"--mbs": mbs, "--seq": seq, "--tp": tp})
    extra = [f"model={json.dumps(model)}"] if model else []
    for opt, field in (("--mbs", "mbs"), ("--seq", "seq"), ("--tp", "tp")):
        if grid[opt]:
            extra.append(f"profile.{field}={grid[opt]}")
    cfg = load_settings(
        extra, {"profile.mbs": "--mbs", "profile.seq": "--seq", "profile.tp": "--tp", "model": "--model"}
    )
    prefect_env(cfg)

    from flows.profile import profile_flow

    path = db_path(cfg)
    summary = profile_flow(
        db_path=str(path),
        model_name=cfg.model,
        profile=cfg.profile,
        cluster_file=str(cluster) if cluster else None,
        run_dir=str(state(cfg).profiling()),
        show_progress=not as_json,
        comm=True,
    )
    if as_json:
        print(json.dumps({**summary.model_dump(mode="json"), "db": str(path)}, default=str))
        return
    _print(summary, path)


def _print(summary: Any, path: Path) -> None:
    from cli.commands.tables import Col, console, print_table
    from flows.queries import profile_rows
    from planner.specs.model import get_model

    con = console()
    frame = profile_rows(path, get_model(summary.model))
    cols = [Col("device", keep=9), Col("layer", keep=9)]
    heads = (("mbs", 8), ("seq", 8), ("tp", 8), ("rc", 8), ("fwd ms", 7), ("bwd ms", 7), ("±%", 3), ("act MB", 4))
    cols += [Col(h, keep=k, right=True) for h, k in heads]
    cols += [Col("GFLOP/s", keep=2, right=True), Col("source", keep=5)]
    rows = []
    for r in frame.filter(frame["device_kind"].is_in(summary.device_kinds)).iter_rows(named=True):
        spread = 100 * r["forward_spread_s"] / r["forward_s"] if r["forward_s"] else 0.0
        source = f"est {r['efficiency']:.2f}" if r["estimated"] else "measured"
        rows.append(
            [
                r["device_kind"],
                r["layer_kind"],
                str(r["micro_batch_size"]),
                str(r["seq_len"]),
                str(r["tp"]),
                "y" if r["recompute"] else "n",
                f"{r['forward_s'] * 1e3:.3f}",
                f"{r['backward_s'] * 1e3:.3f}",
                "-" if r["estimated"] else f"{spread:.1f}",
                f"{r['activation_bytes'] / 1e6:.2f}",
                f"{(r['achieved_flop_per_s'] or 0) / 1e9:.1f}" if not r["estimated"] else "-",
                source,
            ]
        )
    title = f"layer profiles of {summary.model} ({summary.fingerprint})"
    print_table(title, cols, rows, con=con, full="--json")
    con.print(
        "±% = inter-quartile spread of forward time over timed blocks; est = roofline estimate at that efficiency"
    )
    for kind, e in summary.efficiency.items():
        con.print(f"{kind}: estimated at efficiency {e.efficiency:.2f} ({e.source})")
    con.print(
        f"measured {summary.measured} rows in {summary.profiler_runs} profiler run(s), reused "
        f"{summary.reused}, estimated {summary.estimated}; stored in {path}"
    )
