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
    write: Annotated[
        bool, typer.Option("--write", help="allow statements that change the database (backed up first)")
    ] = False,
    restore: Annotated[
        bool, typer.Option("--restore", help="put the newest backup back (the current file is kept aside)")
    ] = False,
) -> None:
    """Show the tables of the meshplan database, or run a SQL query on it (read-only unless --write).

    --write copies the file to <state>/backups/ before running the statement; --restore brings the
    newest copy back (after a damaged file or a statement you regret) and renames the replaced file
    aside, so nothing is deleted."""
    import duckdb
    from rich.console import Console

    from planner.errors import MeshplanError
    from storage import db as store

    path = db_path(load_settings())
    if restore:
        if sql is not None or write:
            raise MeshplanError("--restore", sql, "restore takes no SQL and no --write; run it alone")
        used, aside = store.restore(path)
        kept = f"; the file it replaced is kept at {aside}" if aside else ""
        print(f"restored {path} from backup {used}{kept}")
        return
    try:
        if sql is None:
            frame = store.tables(path)
        elif write:
            with store.connect(path) as con:
                print(f"backed up {path} to {store.backup(con, path, 'before-db-write')}")
            frame = store.query(path, sql)
        else:
            frame = store.query(path, sql, read_only=True)
    except duckdb.Error as exc:
        if "read-only mode" in str(exc):
            raise MeshplanError("sql", sql, "this statement changes the database; add --write to run it") from None
        raise MeshplanError("sql", sql, str(exc).splitlines()[0]) from None
    Console().print(str(frame))
