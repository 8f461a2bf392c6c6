"""The α–β (latency–bandwidth) model of a transfer, fitted to measured times.

Hockney's model: moving n bytes takes t(n) = α + β·n, where α is the per-message latency (s) and
β the inverse bandwidth (s/byte). Fitted by least squares on (size, time) points with both
constants kept non-negative: a negative α or β is measurement noise, not physics, so the fit falls
back to the best model with that constant pinned at zero. Used for links (send/recv), collectives
(their algorithm bandwidth) and by profiling for anything else that scales linearly with bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.errors import MeshplanError


@dataclass(frozen=True, slots=True)
class AlphaBeta:
    """t(n) = alpha_s + beta_s_per_byte·n, with the fit's r² and how many points it used."""

    alpha_s: float
    beta_s_per_byte: float
    r2: float
    num_points: int = 0

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """1/β; infinite when the times did not grow with size (β fitted as 0)."""
        return math.inf if self.beta_s_per_byte == 0 else 1.0 / self.beta_s_per_byte

    def time_s(self, nbytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * nbytes


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> AlphaBeta:
    """Non-negative least-squares fit of t = α + β·n to measured (bytes, seconds) points.

    Raises MeshplanError for fewer than two distinct sizes, mismatched lengths, or negative or
    non-finite inputs, since no line (or only a meaningless one) fits those.
    """
    x = np.asarray(sizes_bytes, dtype=float)
    y = np.asarray(times_s, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise MeshplanError("sizes_bytes", len(x), f"got {x.size} sizes but {y.size} times; pass one time per size")
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or (x < 0).any() or (y < 0).any():
        raise MeshplanError("times_s", y.tolist(), "sizes and times must be finite and non-negative")
    if np.unique(x).size < 2:
        raise MeshplanError(
            "sizes_bytes", x.tolist(), "an α–β fit needs at least 2 distinct message sizes; measure more sizes"
        )
    design = np.column_stack([np.ones_like(x), x])
    (alpha, beta), *_ = np.linalg.lstsq(design, y, rcond=None)
    if beta < 0:  # times shrink with size: pure latency is the best non-negative model
        alpha, beta = float(y.mean()), 0.0
    elif alpha < 0:  # line through the origin: β = Σxy / Σx²
        alpha, beta = 0.0, float((x @ y) / (x @ x))
    return AlphaBeta(float(alpha), float(beta), _r2(x, y, float(alpha), float(beta)), int(x.size))


def _r2(x: np.ndarray, y: np.ndarray, alpha: float, beta: float) -> float:
    """Coefficient of determination; 1.0 when the times are all equal and the fit matches them."""
    residual = float(((y - (alpha + beta * x)) ** 2).sum())
    total = float(((y - y.mean()) ** 2).sum())
    if total == 0:
        return 1.0 if residual == 0 else 0.0
    return 1.0 - residual / total
