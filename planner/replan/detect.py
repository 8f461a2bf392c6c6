"""Straggler detection from per-rank step telemetry: robust baselines, persistence, slowdown factors.

Each rank reports per step its compute time and its communication time (inside collectives and
send/recv, waiting included). In synchronous training a slow rank makes every *other* rank wait,
so step time alone cannot say who is slow; a rank's own compute time can. Hence:

- **compute slowdown** of rank r: (compute_s / work) / baseline(compute_s / work of r), where work
  is the samples its replica processed that step — so re-splitting batch shares (a rebalance)
  neither hides a slow device nor flags a fast one that took more samples.
- **link slowdown**: communication time not explained by waiting for a slower peer. In a step,
  rank r waits at most (max_j compute_j − compute_r) for peers; what is left of comm_s beyond that
  is transfer time, whose growth over its baseline is a slower link.

A compute slowdown must also hold *relative to the rank's peers*: its slowdown over the median
slowdown of the other ranks (each against its own baseline) must exceed 1 + threshold too. On
shared machines a load change slows every rank at once, and that is not a straggler; the median
over peers is not moved by one real straggler among them.

Baseline = median over the first `window` steps after warm-up; scale = MAD (×1.4826 ≈ σ for
normal noise). A slowdown is *declared* when the rolling median of the last `persistence` ratios
exceeds 1 + max(threshold, k·MAD/median/√persistence) — most of the window is out of line — so
one-off blips (GC pauses, a noisy neighbour for one step) never trigger, and a detection comes
about ⌈persistence/2⌉ steps after the onset. The factor is the median out-of-line ratio since the onset.
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
    work: float = 1.0  # samples this rank's replica processed; compute is compared per unit of work


@dataclass(frozen=True, slots=True)
class DetectConfig:
    threshold: float = 0.10
    persistence: int = 5
    window: int = 10
    warmup: int = 2
    mad_k: float = 4.0
    peer_relative: bool = True  # a compute slowdown must also show against the other ranks


@dataclass(frozen=True, slots=True)
class Slowdown:
    """One declared slowdown: a rank's device ('compute') or its links ('link')."""

    kind: str
    rank: int
    factor: float
    detected_at_step: int
    since_step: int
    num_steps: int = 0  # out-of-line steps the factor is the median of (evidence behind it)


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


def _first_sustained(
    series: list[tuple[int, float, float]], limit: float, persistence: int, gate_limit: float
) -> tuple[int, int, float, int] | None:
    """(since_step, detected_step, factor, out-of-line steps behind it) where the rolling median of `persistence` ratios first
    exceeds `limit` while the rolling median of the gate values exceeds `gate_limit`.

    A rolling median, not "p consecutive steps above": on a shared machine single steps swing
    ±40 %, so one fast step would reset a consecutive count, while a median only moves when most
    of the window moved — and a one-step blip never does. The factor is the median ratio from the
    window's start to the last step the rolling median stays above the limit (later calls, with
    more steps, estimate it from more data). Only out-of-line steps count towards it: the window
    that declared the slowdown still holds steps from before the onset."""
    p = persistence
    for i in range(p - 1, len(series)):
        win = series[i - p + 1 : i + 1]
        if median(x for _, x, _ in win) > limit and median(g for _, _, g in win) > gate_limit:
            start = next(j for j in range(i - p + 1, i + 1) if series[j][1] > limit)
            end = i
            while end + 1 < len(series) and median(x for _, x, _ in series[end + 2 - p : end + 2]) > limit:
                end += 1
            # the in-line steps inside the window are the ones from before the onset (or dips)
            out = [x for _, x, _ in series[start : end + 1] if x > limit]
            return series[start][0], series[i][0], median(out), len(out)
    return None


def detect(samples: Iterable[StepSample], cfg: DetectConfig = DetectConfig()) -> Detection:
    """Declared slowdowns in `samples` (any order; steps may be missing for some ranks)."""
    by_step: dict[int, dict[int, StepSample]] = defaultdict(dict)
    for s in samples:
        by_step[s.step][s.rank] = s
    steps = sorted(by_step)[cfg.warmup :]
    if len(steps) < cfg.window + 1:
        return Detection((), 0.0, 0.0, len(steps))
    base_steps, ranks = steps[: cfg.window], sorted({r for st in steps for r in by_step[st]})
    base_step_s = median(max(x.step_time_s for x in by_step[st].values()) for st in base_steps)

    def excess_comm(st: int, r: int) -> float:
        row = by_step[st]
        wait = max(x.compute_s for x in row.values()) - row[r].compute_s
        return max(row[r].comm_s - wait, 0.0)

    def per_work(st: int, r: int) -> float:
        return by_step[st][r].compute_s / by_step[st][r].work

    # each rank's per-sample compute over its own baseline: comparable across ranks whatever their share
    own = {
        r: median(per_work(st, r) for st in base_steps if r in by_step[st])
        for r in ranks
        if sum(r in by_step[st] for st in base_steps) >= 2
    }

    def peer_ratio(st: int, r: int) -> float:
        """Rank r's slowdown over the median slowdown of the other ranks at step `st` (inf: no peers)."""
        others = [per_work(st, j) / own[j] for j in by_step[st] if j != r and own.get(j, 0) > 0]
        peer = median(others) if others else 0.0
        return per_work(st, r) / own[r] / peer if peer > 0 and own.get(r, 0) > 0 else float("inf")

    found: list[Slowdown] = []
    for r in ranks:
        for kind, value in (("compute", lambda st, r=r: per_work(st, r)), ("link", lambda st, r=r: excess_comm(st, r))):
            base = [value(st) for st in base_steps if r in by_step[st]]
            if len(base) < 2:
                continue
            med, mad = _robust(base)
            if med <= 1e-6:  # nothing to measure (e.g. a rank with no communication)
                continue
            # the rolling median of p steps is ~1/sqrt(p) as noisy as one step's ratio
            limit = 1 + max(cfg.threshold, cfg.mad_k * mad / med / cfg.persistence**0.5)
            # Compute: the gate value is the peer-relative ratio (must rise too). Link: the absolute
            # growth of transfer time, which must exceed `threshold` of the baseline step — a
            # transfer that is a sliver of the step is all noise in relative terms.
            if kind == "compute":
                gate = (lambda st, r=r: peer_ratio(st, r)) if cfg.peer_relative else (lambda st: float("inf"))
                gate_limit = 1 + cfg.threshold
            else:
                gate, gate_limit = (lambda st, med=med, value=value: value(st) - med), cfg.threshold * base_step_s
            series = [(st, value(st) / med, gate(st)) for st in steps[cfg.window :] if r in by_step[st]]
            hit = _first_sustained(series, limit, cfg.persistence, gate_limit)
            if hit:
                since, at, factor, n = hit
                found.append(Slowdown(kind, r, factor, at, since, n))
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
    """StepSamples from telemetry rows (step, rank, step_time_s, compute_s, comm_s or comm_wait_s, samples)."""
    return [
        StepSample(
            int(r["step"]),
            int(r["rank"]),
            float(r["step_time_s"]),
            float(r["compute_s"]),
            float(r["comm_s"] if "comm_s" in r else r["comm_wait_s"]),
            float(r.get("samples") or 1),
        )
        for r in rows
    ]
