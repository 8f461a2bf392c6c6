"""Straggler detection from per-rank step telemetry: robust baselines, persistence, slowdown factors.

Each rank reports per step its compute time and its communication time (inside collectives and
send/recv, waiting included). In synchronous training a slow rank makes every *other* rank wait,
so step time alone cannot say who is slow; a rank's own compute time can. Hence:

- **compute slowdown** of rank r: compute_s / baseline(compute_s of r). A rank whose own compute
  grows is a slow device.
- **link slowdown**: communication time not explained by waiting for a slower peer. In a step,
  rank r waits at most (max_j compute_j − compute_r) for peers; what is left of comm_s beyond that
  is transfer time, whose growth over its baseline is a slower link.

Baseline = median over the first `window` steps after warm-up; scale = MAD (×1.4826 ≈ σ for
normal noise). A step is *out of line* when its ratio exceeds 1 + max(threshold, k·MAD/median);
a slowdown is *declared* only after `persistence` consecutive out-of-line steps, so one-off blips
(GC pauses, a noisy neighbour for one step) never trigger. The factor is the median ratio over
the persisted steps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median


@dataclass(frozen=True, slots=True)
class StepSample:
    step: int
    rank: int
    step_time_s: float
    compute_s: float
    comm_s: float


@dataclass(frozen=True, slots=True)
class DetectConfig:
    threshold: float = 0.10
    persistence: int = 3
    window: int = 5
    warmup: int = 2
    mad_k: float = 4.0


@dataclass(frozen=True, slots=True)
class Slowdown:
    """One declared slowdown: a rank's device ('compute') or its links ('link')."""

    kind: str
    rank: int
    factor: float
    detected_at_step: int
    since_step: int


@dataclass(frozen=True, slots=True)
class Detection:
    slowdowns: tuple[Slowdown, ...]
    baseline_step_s: float
    recent_step_s: float
    steps_seen: int

    @property
    def any(self) -> bool:
        return bool(self.slowdowns)

    def compute_factors(self) -> dict[int, float]:
        return {s.rank: s.factor for s in self.slowdowns if s.kind == "compute"}

    def link_factors(self) -> dict[int, float]:
        return {s.rank: s.factor for s in self.slowdowns if s.kind == "link"}


def _robust(values: Sequence[float]) -> tuple[float, float]:
    med = median(values)
    mad = median(abs(v - med) for v in values) * 1.4826
    return med, mad


def _first_persistent(series: list[tuple[int, float]], limit: float, persistence: int) -> tuple[int, int, float] | None:
    """(since_step, detected_step, factor) of the first run of >= `persistence` ratios above `limit`.

    The factor is the median ratio over the whole run (it keeps growing past detection while the
    slowdown lasts, so later calls estimate it from more steps)."""
    run: list[tuple[int, float]] = []
    for step, ratio in series:
        if ratio > limit:
            run.append((step, ratio))
        elif len(run) >= persistence:
            break
        else:
            run = []
    if len(run) < persistence:
        return None
    return run[0][0], run[persistence - 1][0], median(r for _, r in run)


def detect(samples: Iterable[StepSample], cfg: DetectConfig = DetectConfig()) -> Detection:
    """Declared slowdowns in `samples` (any order; steps may be missing for some ranks)."""
    by_step: dict[int, dict[int, StepSample]] = defaultdict(dict)
    for s in samples:
        by_step[s.step][s.rank] = s
    steps = sorted(by_step)[cfg.warmup :]
    if len(steps) < cfg.window + 1:
        return Detection((), 0.0, 0.0, len(steps))
    base_steps, ranks = steps[: cfg.window], sorted({r for st in steps for r in by_step[st]})

    def excess_comm(st: int, r: int) -> float:
        row = by_step[st]
        wait = max(x.compute_s for x in row.values()) - row[r].compute_s
        return max(row[r].comm_s - wait, 0.0)

    found: list[Slowdown] = []
    for r in ranks:
        for kind, value in (("compute", lambda st, r=r: by_step[st][r].compute_s), ("link", lambda st, r=r: excess_comm(st, r))):
            base = [value(st) for st in base_steps if r in by_step[st]]
            if len(base) < 2:
                continue
            med, mad = _robust(base)
            if med <= 1e-6:  # nothing to measure (e.g. a rank with no communication)
                continue
            limit = 1 + max(cfg.threshold, cfg.mad_k * mad / med)
            series = [(st, value(st) / med) for st in steps[cfg.window :] if r in by_step[st]]
            hit = _first_persistent(series, limit, cfg.persistence)
            if hit:
                since, at, factor = hit
                found.append(Slowdown(kind, r, factor, at, since))
    found = _drop_echoes(found)
    step_times = [max(x.step_time_s for x in by_step[st].values()) for st in steps]
    return Detection(
        tuple(sorted(found, key=lambda s: (s.detected_at_step, s.rank))),
        median(step_times[: cfg.window]),
        median(step_times[-cfg.persistence :]),
        len(steps),
    )


def _drop_echoes(found: list[Slowdown]) -> list[Slowdown]:
    """A compute straggler's peers see longer transfers too when the schedule overlaps them; keep
    link slowdowns only where no compute slowdown explains the same steps."""
    compute = [s for s in found if s.kind == "compute"]
    if not compute:
        return found
    return compute + [s for s in found if s.kind == "link" and s.factor > max(c.factor for c in compute)]


def samples_from_rows(rows: Iterable[dict]) -> list[StepSample]:
    """StepSamples from telemetry rows (dicts with step, rank, step_time_s, compute_s, comm_s)."""
    return [
        StepSample(int(r["step"]), int(r["rank"]), float(r["step_time_s"]), float(r["compute_s"]), float(r["comm_s"]))
        for r in rows
    ]
