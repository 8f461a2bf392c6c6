"""Tables the commands print, sized to stay whole on an 80-column terminal or a pipe.

Rich takes the terminal's width, or 80 (or $COLUMNS) when stdout is not a terminal; a table wider
than that wraps its cells into an unreadable block. So the ranking abbreviates what it can (layout
"pp4×dp4×tp1 m1 i1f1b z2", baselines "meg.", speed-ups "×meg"), formats numbers compactly, and moves the long text
(bottlenecks, speed-up legend) into lines under the table. The layout names every choice that
tells two plans apart ("rc4/2": 4 stages recompute every 2nd block; "sel2": selective recompute on
2 stages; "sp": sequence parallelism; "fp8": fp8 linears; "×cp2": context parallelism over 2 ranks). `--json` keeps every field unabbreviated.

Imports only rich (inside the functions), like the command modules it serves.
"""

from __future__ import annotations

from typing import Any

GIB = 2**30
_SCHEDULES = {"interleaved-1f1b": "i1f1b", "1f1b": "1f1b", "gpipe": "gpipe"}
_SHARDING = {"none": "z0", "zero1": "z1", "zero2": "z2", "zero3": "z3"}


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
    from rich.table import Table

    vs = [c for c in rows[0] if c.startswith("vs_")] if rows else []
    t = Table(title=title, box=None, padding=(0, 1), pad_edge=False, title_justify="left", header_style="bold")
    for name in ("#", "layout", "step", "tok/s", "MFU", "GiB", *(f"×{c[3:6]}" for c in vs)):
        t.add_column(name, no_wrap=True, justify="left" if name in ("#", "layout") else "right")
    for r in rows:
        cells = [
            _rank_label(r["rank"]) + ("*" if r.get("launchable") is False else ""),
            short_layout(r["layout"]),
            short_time(r["step_time_s"]),
            short_count(r["tokens_per_s"]),
            f"{r['mfu']:.1%}",
            f"{r['peak_memory_bytes'] / GIB:.1f}/{r['memory_capacity_bytes'] / GIB:.0f}",
        ]
        cells += ["-" if r.get(c) is None else f"{r[c]:.2f}" for c in vs]
        t.add_row(*cells)
    con = console()
    con.print(t)
    names = sorted({str(r["rank"]).split(":", 1)[1] for r in rows if str(r["rank"]).startswith("baseline:")})
    if names:
        shorts = "/".join(f"×{n[:3]}" for n in names)
        con.print(f"{shorts}: {'/'.join(n + chr(39) + 's' for n in names)} step time ÷ this plan's; GiB: peak/capacity")
    refused = [r for r in rows if r.get("launchable") is False]
    if refused:
        con.print(f"*: meshplan's runtime cannot launch it ({refused[0]['refused']}); ranked after those it can")
    if rows:
        con.print(f"best plan {rows[0]['fingerprint']}: bottleneck {rows[0]['bottleneck']}")
