"""Inspection commands: `gpus`, `models`, `db`."""

from __future__ import annotations

from typing import Annotated

import typer

from flows.app import app, db_path, load_settings


@app.command()
def gpus() -> None:
    """List the GPU catalog (datasheet figures and their sources)."""
    from rich.console import Console
    from rich.table import Table

    from planner.specs.catalog import CATALOG

    t = Table(title="GPU catalog (dense peaks)")
    for col in ("name", "memory GiB", "bf16 TFLOP/s", "fp32 TFLOP/s", "HBM GB/s", "fabric GB/s", "source"):
        t.add_column(col)
    for g in CATALOG.values():
        t.add_row(
            g.name + (" *" if g.estimated else ""),
            f"{g.memory_bytes / 2**30:.0f}",
            f"{g.peak_flop_per_s('bf16') / 1e12:.0f}",
            f"{g.peak_fp32_flop_per_s / 1e12:.1f}",
            f"{g.memory_bandwidth_bytes_per_s / 1e9:.0f}",
            f"{g.fabric_bytes_per_s / 1e9:.0f}" if g.fabric_bytes_per_s else "-",
            g.source,
        )
    Console().print(t)


@app.command()
def models() -> None:
    """List the model presets."""
    from rich.console import Console
    from rich.table import Table

    from planner.specs.model import PRESETS

    t = Table(title="model presets")
    for col in ("name", "family", "layers", "hidden", "heads", "kv", "ffn", "vocab", "seq", "params"):
        t.add_column(col)
    for m in PRESETS.values():
        t.add_row(
            m.name,
            m.family,
            str(m.num_layers),
            str(m.hidden),
            str(m.num_heads),
            str(m.kv_heads),
            str(m.ffn),
            str(m.vocab_size),
            str(m.seq_len),
            f"{m.num_params() / 1e9:.3g}B",
        )
    Console().print(t)


@app.command()
def db(
    sql: Annotated[str | None, typer.Argument(help="a SQL query to run; omit to list tables")] = None,
) -> None:
    """Show the tables of the meshplan database, or run a SQL query on it."""
    import duckdb
    from rich.console import Console

    from planner.errors import MeshplanError
    from storage.db import query, tables

    path = db_path(load_settings())
    try:
        frame = tables(path) if sql is None else query(path, sql)
    except duckdb.Error as exc:
        raise MeshplanError("sql", sql, str(exc).splitlines()[0]) from None
    Console().print(str(frame))
