"""Progress of a running torchrun job, read from the telemetry rows the flow process already polls.

`StepProgress.update(rows)` takes the new rows of the ranks' JSONL files (launcher.control.TelemetryTail)
and counts a step as done once every rank of that step's layout (pp × dp × tp) has reported it. Per
done step it keeps what the run_steps view computes after ingest — the slowest rank's step time,
the share-weighted loss of the last stages, tokens/s of the first stage — and an ETA from the wall
time between recent done steps (so checkpoints and launch gaps count).

Where it shows: a rich progress bar when stdout is a terminal; otherwise (CI, piped output, pytest)
a plain line on stdout every `every_steps` steps or `every_s` seconds, and once at the end, also
sent to the Prefect run log. Rendering costs nothing extra: no file is read here.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass(frozen=True)
class StepStats:
    done: int  # steps completed (the last done step's index + 1; a resumed run starts past 0)
    total: int
    step: int
    step_time_s: float
    loss: float | None
    tokens_per_s: float | None
    eta_s: float | None

    def line(self) -> str:
        pct = 100 * self.done / self.total if self.total else 100.0
        loss = f"{self.loss:.4f}" if self.loss is not None else "-"
        tps = f"{self.tokens_per_s:,.0f}" if self.tokens_per_s is not None else "-"
        return (
            f"train: steps {self.done}/{self.total} ({pct:.0f}%) | loss {loss} | "
            f"step {self.step_time_s * 1e3:.1f} ms | {tps} tok/s | ETA {_eta(self.eta_s)}"
        )


def _eta(seconds: float | None) -> str:
    return str(timedelta(seconds=round(seconds))) if seconds is not None else "-"


def step_stats(rows: list[dict[str, Any]]) -> tuple[float, float | None, float | None, float]:
    """(step time, loss, tokens/s, wall time) of one step from all its ranks' rows, as run_steps defines them."""
    step_s = max(r["step_time_s"] for r in rows)
    last = [r for r in rows if r.get("loss") is not None and r.get("tp_index", 0) == 0]
    samples = sum(r.get("samples", 1) for r in last)
    loss = sum(r["loss"] * r.get("samples", 1) for r in last) / samples if samples else None
    tokens = sum(r.get("tokens", 0) for r in rows if r.get("stage", 0) == 0 and r.get("tp_index", 0) == 0)
    return step_s, loss, (tokens / step_s if tokens and step_s > 0 else None), max(r["wall_time_s"] for r in rows)


class StepProgress:
    """Aggregates telemetry rows into done steps and shows them (see the module docstring)."""

    def __init__(
        self,
        total: int,
        enabled: bool = True,
        every_steps: int | None = None,
        every_s: float = 10.0,
        terminal: bool | None = None,
    ) -> None:
        self.total = total
        self.enabled = enabled
        self.every_steps = every_steps or max(1, round(total / 10))
        self.every_s = every_s
        self.latest: StepStats | None = None
        self._pending: dict[int, dict[int, dict[str, Any]]] = {}  # step -> rank -> row, until the step is done
        self._walls: deque[tuple[int, float]] = deque(maxlen=20)  # (done, wall time) of recent done steps
        self._shown_done = 0
        self._shown_at = time.monotonic()
        self._bar: Any = None
        if enabled and (terminal if terminal is not None else _is_terminal()):
            self._bar = _RichBar(total)

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, rows: list[dict[str, Any]]) -> StepStats | None:
        """Take new telemetry rows; returns the latest done step's stats (None before the first)."""
        newest: int | None = None
        for r in rows:
            if "step" not in r or "step_time_s" not in r:
                continue
            self._pending.setdefault(r["step"], {})[r["rank"]] = r  # a redone step (after a restart) overwrites
            world = r.get("pp", 1) * r.get("dp", 1) * r.get("tp", 1)
            if len(self._pending[r["step"]]) >= world and (newest is None or r["step"] >= newest):
                newest = r["step"]
        if newest is None:
            return self.latest
        done_rows = list(self._pending.pop(newest).values())
        for s in [s for s in self._pending if s < newest]:  # older steps can no longer be the latest
            del self._pending[s]
        step_s, loss, tps, wall = step_stats(done_rows)
        done = newest + 1
        if self._walls and self._walls[-1][0] >= done:  # a restart went back to its checkpoint
            self._walls.clear()
        self._walls.append((done, wall))
        (d0, w0), (d1, w1) = self._walls[0], self._walls[-1]
        per_step = (w1 - w0) / (d1 - d0) if d1 > d0 else step_s
        self.latest = StepStats(done, self.total, newest, step_s, loss, tps, max(self.total - done, 0) * per_step)
        self._show()
        return self.latest

    def _show(self) -> None:
        s = self.latest
        if not self.enabled or s is None:
            return
        if self._bar is not None:
            self._bar.update(s)
            return
        now = time.monotonic()
        if s.done >= self._shown_done + self.every_steps or (
            s.done > self._shown_done and now - self._shown_at >= self.every_s
        ):
            self._emit(s.line())
            self._shown_done, self._shown_at = s.done, now

    def close(self) -> None:
        """Stop the bar; in plain mode, print the last done step unless it was just printed."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            if self.latest is not None:
                _log(self.latest.line())
        elif self.latest is not None and self.latest.done != self._shown_done:
            self._emit(self.latest.line())
            self._shown_done = self.latest.done
        self.enabled = False

    @staticmethod
    def _emit(line: str) -> None:
        # not print(): with log_prints on, Prefect would send it only to the run log, which the CLI
        # keeps at WARNING — the user watching `meshplan run` in CI would see nothing
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        _log(line)


_sinks: list[Callable[[str], None]] = []


def add_log_sink(sink: Callable[[str], None]) -> None:
    """Also send every progress line to `sink` (tasks/ adds the Prefect run log, so lines reach the UI)."""
    if sink not in _sinks:
        _sinks.append(sink)


def _log(line: str) -> None:
    for sink in _sinks:
        sink(line)


@contextmanager
def working(what: str) -> Iterator[None]:
    """Progress for one long call with no steps to count (the plan search): a spinner with `what`
    on a terminal, otherwise `what` as one plain line (stdout and the Prefect run log) before it runs."""
    if _is_terminal():
        from rich.console import Console

        with Console().status(what):
            yield
    else:
        StepProgress._emit(what)
        yield


def say(line: str) -> None:
    """One plain line on stdout and in the Prefect run log (what the CLI shows at its WARNING log level)."""
    StepProgress._emit(line)


def _is_terminal() -> bool:
    """stdout itself is a terminal (not rich's notion, which FORCE_COLOR — set by many CI setups — turns on)."""
    try:
        return sys.stdout.isatty() and os.environ.get("TERM", "") not in ("dumb", "unknown")
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


class _RichBar:
    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=sys.stdout, force_terminal=True)  # the caller checked that stdout is a terminal
        self._progress = Progress(
            TextColumn("training"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[stats]}"),
            console=console,
            refresh_per_second=2,
        )
        self._task = self._progress.add_task("train", total=total, stats="waiting for the first step…")
        self._progress.start()

    def update(self, s: StepStats) -> None:
        loss = f"loss {s.loss:.4f}" if s.loss is not None else "loss -"
        tps = f"{s.tokens_per_s:,.0f} tok/s" if s.tokens_per_s is not None else "- tok/s"
        stats = f"{loss} | {s.step_time_s * 1e3:.1f} ms/step | {tps} | ETA {_eta(s.eta_s)}"
        self._progress.update(self._task, completed=s.done, stats=stats)

    def stop(self) -> None:
        self._progress.stop()
