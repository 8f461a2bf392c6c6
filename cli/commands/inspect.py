"""Inspection commands: `gpus`, `models`, `db`."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.app import app, db_path, load_settings
from cli.commands.tables import Col, FormatOption, emit, print_table


@app.command()
def gpus(fmt: FormatOption = "table") -> None:
    """List the GPU catalog (datasheet figures and their sources)."""
    from planner.specs.catalog import CATALOG

    if emit(fmt, [g.model_dump() for g in CATALOG.values()]):
        return
    cols = [
        Col("name", keep=9),
        Col("GiB", keep=5, right=True),
        Col("bf16 TF/s", keep=8, right=True),
        Col("fp32 TF/s", keep=4, right=True),
        Col("HBM GB/s", keep=6, right=True),
        Col("fabric GB/s", keep=3, right=True),
        Col("source", keep=0, wrap=True),
    ]
    rows = [
        [
            g.name + (" *" if g.estimated else ""),
            f"{g.memory_bytes / 2**30:.0f}",
            f"{g.peak_flop_per_s('bf16') / 1e12:.0f}",
            f"{g.peak_fp32_flop_per_s / 1e12:.1f}",
            f"{g.memory_bandwidth_bytes_per_s / 1e9:.0f}",
            f"{g.fabric_bytes_per_s / 1e9:.0f}" if g.fabric_bytes_per_s else "-",
            g.source,
        ]
        for g in CATALOG.values()
    ]
    note = "* a figure is estimated (see --format json notes); TF/s: dense peak TFLOP/s; GB/s per direction"
    print_table("GPU catalog (dense peaks)", cols, rows, notes=[note])


@app.command()
def models(fmt: FormatOption = "table") -> None:
    """List the model presets."""
    from planner.specs.model import PRESETS

    if emit(fmt, [{**m.model_dump(), "params": m.num_params()} for m in PRESETS.values()]):
        return
    cols = [Col("name", keep=9), Col("family", keep=1)]
    cols += [Col(h, keep=k, right=True) for h, k in (("layers", 5), ("hidden", 5), ("heads", 4), ("kv", 3))]
    cols += [Col(h, keep=k, right=True) for h, k in (("ffn", 3), ("vocab", 2), ("seq", 4), ("params", 8))]
    rows = [
        [
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
        ]
        for m in PRESETS.values()
    ]
    print_table("model presets", cols, rows)


@app.command()
def db(
    sql: Annotated[str | None, typer.Argument(help="a SQL query to run; omit to list tables")] = None,
    write: Annotated[
        bool, typer.Option("--write", help="allow statements that change the database (backed up first)")
    ] = False,
    restore: Annotated[
        bool, typer.Option("--restore", help="put the newest backup back (the current file is kept aside)")
    ] = False,
    fmt: FormatOption = "table",
) -> None:
    """Show the tables of the meshplan database, or run a SQL query on it (read-only unless --write).

    --write copies the file to <state>/backups/ before running the statement; --restore brings the
    newest copy back (after a damaged file or a statement you regret) and renames the replaced file
    aside, so nothing is deleted."""
    from flows.queries import db_backup, db_query, db_restore, db_tables
    from planner.errors import MeshplanError

    path = db_path(load_settings())
    if restore:
        if sql is not None or write:
            raise MeshplanError("--restore", sql, "restore takes no SQL and no --write; run it alone")
        used, aside = db_restore(path)
        kept = f"; the file it replaced is kept at {aside}" if aside else ""
        print(f"restored {path} from backup {used}{kept}")
        return
    if sql is None:
        frame = db_tables(path)
    else:
        if write:
            print(f"backed up {path} to {db_backup(path, 'before-db-write')}")
        frame, cut = db_query(path, sql, read_only=not write)
        if cut:
            from planner.limits import MAX_DB_ROWS

            typer.echo(
                f"note: showing the first {MAX_DB_ROWS:,} rows; add LIMIT/OFFSET, or COPY (...) TO 'out.parquet' "
                "with --write for all of them",
                err=True,
            )
    if emit(fmt, frame.to_dicts()):
        return
    title = f"tables of {path}" if sql is None else sql
    rows = [["-" if v is None else str(v) for v in row] for row in frame.iter_rows()]
    print_table(title, [Col(c, keep=frame.width - i, wrap=True) for i, c in enumerate(frame.columns)], rows)
