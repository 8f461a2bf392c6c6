"""A serving workload: models, each with a request trace, a latency SLO and a request shape.

A model's arrivals are a Gamma renewal process given by its rate (requests/s) and coefficient of
variation (CV = 1 is Poisson; AlpaServe, OSDI'23 §6.1, sweeps CV to model bursty traffic), or they
come from a CSV of arrival times (`model,arrival_s`, sorted, ≥ 0). The SLO is either seconds or a
multiple of the model's single-device latency (`slo_scale`, the x-axis of AlpaServe's Fig. 11):
the latter is resolved against a device by `resolve_slos`.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.errors import MeshplanError
from planner.limits import MAX_CV, MAX_RATE, MAX_REQUESTS, MAX_TRACE_S
from planner.specs.model import ModelSpec, get_model
from planner.validation import parse, parse_toml


class ServedModel(BaseModel):
    """One model to serve: its architecture (a preset or dimensions), traffic, SLO and request shape."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    preset: str | None = None
    dims: ModelSpec | None = None
    seq: int | None = Field(default=None, gt=0, description="tokens per request (default: the model's seq_len)")
    batch: int = Field(default=1, gt=0, le=1024, description="sequences per request")
    # bounds: planner/limits.py says why each
    rate: float = Field(default=0.0, ge=0, le=MAX_RATE, description="mean requests per second (Gamma arrivals)")
    cv: float = Field(default=1.0, gt=0, le=MAX_CV, description="coefficient of variation of inter-arrival times")
    slo_s: float | None = Field(default=None, description="latency SLO, seconds")
    slo_scale: float | None = Field(default=None, description="SLO as a multiple of single-device latency")

    @model_validator(mode="after")
    def _check(self) -> ServedModel:
        if (self.preset is None) == (self.dims is None):
            raise MeshplanError(f"models.{self.name}.preset", self.preset, "give exactly one of preset or dims")
        if self.preset is not None:
            get_model(self.preset)  # an unknown preset: one line with the closest names
        for field in ("slo_s", "slo_scale"):
            v = getattr(self, field)
            if v is not None and not v > 0:
                raise MeshplanError(f"models.{self.name}.{field}", v, "must be > 0 (a latency budget); e.g. 0.5")
        if (self.slo_s is None) == (self.slo_scale is None):
            raise MeshplanError(f"models.{self.name}.slo_s", self.slo_s, "give exactly one of slo_s or slo_scale")
        if self.seq is not None and self.seq > self.spec.seq_len:
            raise MeshplanError(
                f"models.{self.name}.seq", self.seq, f"must be ≤ the model's seq_len {self.spec.seq_len}"
            )
        return self

    @property
    def spec(self) -> ModelSpec:
        return self.dims if self.dims is not None else get_model(self.preset or "")

    @property
    def tokens(self) -> int:
        return self.seq or self.spec.seq_len


class Workload(BaseModel):
    """Models and how long to simulate them; `max_batch` bounds how many queued requests of one
    model a group runs as one batch (1 = no batching)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "workload"
    models: tuple[ServedModel, ...] = Field(min_length=1)
    duration_s: float = Field(default=60.0, gt=0, le=MAX_TRACE_S)
    seed: int = 0
    max_batch: int = Field(default=1, ge=1, le=256)
    dtype: str = "fp16"

    @model_validator(mode="after")
    def _unique(self) -> Workload:
        names = [m.name for m in self.models]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise MeshplanError("models.name", dup[0], "model names must be unique; rename one of them")
        return self


def parse_workload_toml(text: str, origin: str = "workload.toml") -> Workload:
    """A user's workload file; its Gamma trace must fit the simulator (planner/limits.MAX_REQUESTS).
    Checked here, not on every Workload: a placement replaying a day-long trace of its own is bounded
    by the trace's rows instead."""
    w = parse(Workload, parse_toml(text, origin), origin)
    expected = sum(m.rate for m in w.models) * w.duration_s
    if expected > MAX_REQUESTS:
        raise MeshplanError(
            f"{origin}: models.rate",
            "+".join(f"{m.rate:g}" for m in w.models),
            f"{expected:.3g} requests over duration_s={w.duration_s:g} is more than the simulator holds "
            f"({MAX_REQUESTS:,}); lower the rates or the duration",
        )
    return w


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival: arrival seconds and the model index of each (numpy arrays)."""

    arrival_s: np.ndarray
    model: np.ndarray
    duration_s: float

    def __len__(self) -> int:
        return len(self.arrival_s)

    def head(self, duration_s: float) -> Trace:
        """The requests arriving before `duration_s` (a shorter trace for a quicker search)."""
        n = int(np.searchsorted(self.arrival_s, duration_s))
        return Trace(self.arrival_s[:n], self.model[:n], min(duration_s, self.duration_s))

    def to_csv(self, names: list[str]) -> str:
        rows = ["model,arrival_s"] + [f"{names[m]},{t:.6f}" for t, m in zip(self.arrival_s, self.model, strict=True)]
        return "\n".join(rows) + "\n"


def gamma_arrivals(rate: float, cv: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Gamma renewal process: inter-arrival shape 1/cv², scale cv²/rate (mean 1/rate)."""
    if rate <= 0:
        return np.zeros(0)
    shape, scale = 1.0 / cv**2, cv**2 / rate
    n = int(rate * duration_s * 1.5 + 10 * math.sqrt(rate * duration_s + 1) + 10)
    t = np.cumsum(rng.gamma(shape, scale, size=n))
    # rare: extend until the horizon is covered (bounded: a heavy-tailed draw may need a few rounds,
    # and MAX_CV keeps the shape where the sums grow; never more than MAX_REQUESTS arrivals)
    while t[-1] < duration_s and len(t) < MAX_REQUESTS:
        t = np.concatenate([t, t[-1] + np.cumsum(rng.gamma(shape, scale, size=n))])
    return t[t < duration_s]


def make_trace(w: Workload, rates: dict[str, float] | None = None, cv: float | None = None) -> Trace:
    """Gamma arrivals of every model (`rates` / `cv` override the workload's, for sweeps); one seeded
    stream per model, so a model's arrivals do not change when another model's rate does."""
    times, models = [], []
    for i, m in enumerate(w.models):
        rng = np.random.default_rng([w.seed, i])
        t = gamma_arrivals((rates or {}).get(m.name, m.rate), cv if cv is not None else m.cv, w.duration_s, rng)
        times.append(t)
        models.append(np.full(len(t), i, dtype=np.int64))
    return _merge(times, models, w.duration_s)


def _merge(times: list[np.ndarray], models: list[np.ndarray], duration_s: float) -> Trace:
    t = np.concatenate(times) if times else np.zeros(0)
    m = np.concatenate(models) if models else np.zeros(0, dtype=np.int64)
    order = np.argsort(t, kind="stable")
    return Trace(t[order], m[order], duration_s)


def parse_trace_csv(text: str, names: list[str], origin: str = "trace.csv") -> Trace:
    """A `model,arrival_s` CSV: times must be ≥ 0 and sorted ascending, models among `names`."""
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or not {"model", "arrival_s"} <= set(reader.fieldnames):
        raise MeshplanError(f"{origin}: header", reader.fieldnames, "the first line must be `model,arrival_s`")
    times: list[float] = []
    models: list[int] = []
    for line, row in enumerate(reader, start=2):
        field = f"{origin}:{line} arrival_s"
        try:
            t = float(row["arrival_s"])
        except (TypeError, ValueError):
            raise MeshplanError(field, row["arrival_s"], "must be a number of seconds") from None
        if not 0 <= t <= MAX_TRACE_S:
            raise MeshplanError(
                field,
                t,
                f"must be ≥ 0 and ≤ {MAX_TRACE_S:g} (seconds since the trace starts: a day at most); drop or shift that row",
            )
        if len(times) >= MAX_REQUESTS:
            raise MeshplanError(
                origin, f"{MAX_REQUESTS:,}+ rows", "more requests than the simulator holds; split the trace"
            )
        if times and t < times[-1]:
            raise MeshplanError(
                field, t, f"times must be sorted ascending (previous row {times[-1]}); sort by arrival_s"
            )
        if row["model"] not in names:
            raise MeshplanError(
                f"{origin}:{line} model", row["model"], f"not a served model; one of {', '.join(names)}"
            )
        times.append(t)
        models.append(names.index(row["model"]))
    if not times:
        raise MeshplanError(origin, "empty", "the trace has no requests; add rows `model,arrival_s`")
    return Trace(np.array(times), np.array(models, dtype=np.int64), times[-1] + 1e-9)
