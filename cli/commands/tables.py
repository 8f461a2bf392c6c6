"""Tables the commands print, sized to stay whole on an 80-column terminal or a pipe.

Rich takes the terminal's width, or 80 (or $COLUMNS) when stdout is not a terminal; a table wider
than that wraps its cells into an unreadable block. So the ranking abbreviates what it can (layout
"pp4×dp4×tp1 m1 i1f1b z2", baselines "meg.", speed-ups "×meg"), formats numbers compactly, and moves the long text
(bottlenecks, speed-up legend) into lines under the table. The layout names every choice that
tells two plans apart ("rc4/2": 4 stages recompute every 2nd block; "sel2": selective recompute on
2 stages; "sp": sequence parallelism; "fp8": fp8 linears; "×cp2": context parallelism over 2 ranks). `--json` keeps every field unabbreviated.

`print_table` is the one way a command prints a table: every column sized to its longest cell and its
header, so a name is never cut to "…"; when the columns do not fit the width, free-text columns wrap and
then whole columns are dropped (least important first) with a note naming them. `emit` adds
`--format json|csv` (every field) to listing commands.

Imports only rich (inside the functions) and typer, like the command modules it serves.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer

GIB = 2**30
_SCHEDULES = {"interleaved-1f1b": "i1f1b", "1f1b": "1f1b", "gpipe": "gpipe"}
_SHARDING = {"none": "z0", "zero1": "z1", "zero2": "z2", "zero3": "z3"}


FORMATS = ("table", "json", "csv")
FormatOption = Annotated[str, typer.Option("--format", help="table | json | csv")]
_GAP = 2  # cells between two columns (padding 1 on each side, none at the edges)
_MIN_WRAP = 12  # a free-text column wraps down to this width before columns are dropped


@dataclass(frozen=True)
class Col:
    """A table column. `keep`: higher stays longer when the width runs out (0: dropped first).
    `wrap`: free text that may wrap onto several lines (never a name)."""

    header: str
    keep: int = 1
    wrap: bool = False
    right: bool = False


def check_format(fmt: str) -> str:
    from planner.errors import MeshplanError

    if fmt not in FORMATS:
        raise MeshplanError("--format", fmt, f"choose one of {', '.join(FORMATS)}")
    return fmt


def emit(fmt: str, records: list[dict[str, Any]]) -> bool:
    """Print `records` as JSON or CSV (header row first) when `fmt` asks for it; False for "table"."""
    if check_format(fmt) == "json":
        typer.echo(json.dumps(records, indent=2, default=str))
    elif fmt == "csv":
        fields = list(dict.fromkeys(k for r in records for k in r))
        w = csv.DictWriter(sys.stdout, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        for r in records:
            w.writerow({k: json.dumps(v, default=str) if isinstance(v, dict | list) else v for k, v in r.items()})
    else:
        return False
    return True


def fit(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> tuple[list[int], list[tuple[int, bool]]]:
    """Which columns to show (indices) and each one's (minimum width, wraps) so the table fits `width`."""
    from rich.cells import cell_len

    need = [max([cell_len(c.header), *(cell_len(r[i]) for r in rows)]) for i, c in enumerate(cols)]
    shown = list(range(len(cols)))

    def total(wrap_to: bool) -> int:
        return sum(min(need[i], _MIN_WRAP) if wrap_to and cols[i].wrap else need[i] for i in shown) + _GAP * (
            len(shown) - 1
        )

    while total(wrap_to=True) > width and len(shown) > 1:
        victim = min(reversed(shown), key=lambda i: cols[i].keep)  # the least important, rightmost first
        shown.remove(victim)
    wrapped = total(wrap_to=False) > width
    return shown, [(min(need[i], _MIN_WRAP), True) if wrapped and cols[i].wrap else (need[i], False) for i in shown]


def print_table(
    title: str,
    cols: Sequence[Col],
    rows: Sequence[Sequence[str]],
    notes: Sequence[str] = (),
    con: Any = None,
    full: str = "--format csv",
) -> None:
    """A header row, then `rows`, fitted to the console width (see the module docstring), then `notes`."""
    from rich.table import Table
    from rich.text import Text

    con = con or console()
    shown, widths = fit(cols, rows, con.width)
    con.print(Text(title, style="table.title"))  # above the table, not squeezed to its width
    t = Table(box=None, padding=(0, 1), pad_edge=False, title_justify="left", header_style="bold")
    for i, (w, wraps) in zip(shown, widths, strict=True):
        c = cols[i]
        justify = "right" if c.right else "left"
        t.add_column(c.header, no_wrap=not wraps, overflow="fold", min_width=w, justify=justify)
    for r in rows:
        t.add_row(*(Text(r[i]) for i in shown))  # cells are data: no rich markup in them
    con.print(t)
    dropped = [cols[i].header for i in range(len(cols)) if i not in shown]
    if dropped:
        con.print(f"(not shown at {con.width} columns: {', '.join(dropped)}; {full} has them all)")
    for line in notes:
        con.print(line)


def console() -> Any:
    from rich.console import Console

    return Console()


def short_layout(layout: str) -> str:
    """'pp4×dp4×tp1 mbs1 interleaved-1f1b zero2 rc2' -> 'pp4×dp4×tp1 m1 i1f1b z2 rc2'."""
    words = layout.split()
    out = []
    for w in words:
        if w.startswith("mbs"):
            w = "m" + w[3:]
        out.append(_SCHEDULES.get(w, _SHARDING.get(w, w)))
    return " ".join(out)


def short_count(x: float) -> str:
    """936852.4 -> '937k', 1.2e6 -> '1.2M'."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            v = x / scale
            return f"{v:.3g}{unit}"
    return f"{x:.3g}"


def short_time(seconds: float) -> str:
    """0.1972 -> '197 ms', 201.4 -> '201 s', 0.00042 -> '420 µs', 7300 -> '2.03 h'."""
    for scale, unit in ((3600.0, "h"), (1.0, "s"), (1e-3, "ms")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e6:.3g} µs"


def _rank_label(rank: Any) -> str:
    text = str(rank)
    return text.split(":", 1)[1][:3] + "." if text.startswith("baseline:") else text


def print_ranking(rows: list[dict], title: str) -> None:
    """The ranked plans (ranking_rows) as a table, bottlenecks and the legend as lines below it."""
    vs = [c for c in rows[0] if c.startswith("vs_")] if rows else []
    cols = [Col("#", keep=9), Col("layout", keep=9)]
    cols += [Col(h, keep=k, right=True) for h, k in (("step", 8), ("tok/s", 6), ("MFU", 5), ("GiB", 7))]
    cols += [Col(f"×{c[3:6]}", keep=4 - i, right=True) for i, c in enumerate(vs)]
    cells = []
    for r in rows:
        cells.append(
            [
                _rank_label(r["rank"]) + ("*" if r.get("launchable") is False else ""),
                short_layout(r["layout"]),
                short_time(r["step_time_s"]),
                short_count(r["tokens_per_s"]),
                f"{r['mfu']:.1%}",
                f"{r['peak_memory_bytes'] / GIB:.1f}/{r['memory_capacity_bytes'] / GIB:.0f}",
                *("-" if r.get(c) is None else f"{r[c]:.2f}" for c in vs),
            ]
        )
    con = console()
    print_table(title, cols, cells, con=con, full="--json")
    names = sorted({str(r["rank"]).split(":", 1)[1] for r in rows if str(r["rank"]).startswith("baseline:")})
    if names:
        shorts = "/".join(f"×{n[:3]}" for n in names)
        con.print(f"{shorts}: {'/'.join(n + chr(39) + 's' for n in names)} step time ÷ this plan's; GiB: peak/capacity")
    refused = [r for r in rows if r.get("launchable") is False]
    if refused:
        con.print(f"*: meshplan's runtime cannot launch it ({refused[0]['refused']}); ranked after those it can")
    if rows:
        con.print(f"best plan {rows[0]['fingerprint']}: bottleneck {rows[0]['bottleneck']}")
