"""The α–β fit recovers latency and bandwidth from (bytes, seconds) points and refuses what cannot fit."""

import math

import numpy as np
import pytest

from planner.errors import MeshplanError
from planner.measure.alphabeta import AlphaBeta, fit_alpha_beta


def test_fit_recovers_alpha_and_beta_from_exact_points():
    sizes = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22]
    alpha, bw = 25e-6, 2.5e9
    fit = fit_alpha_beta(sizes, [alpha + s / bw for s in sizes])
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(bw, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.num_points == 5
    assert fit.time_s(1e6) == pytest.approx(alpha + 1e6 / bw)


def test_fit_recovers_alpha_and_beta_within_noise():
    rng = np.random.default_rng(0)
    sizes = np.repeat([1e3, 1e4, 1e5, 1e6, 4e6], 5)
    times = (50e-6 + sizes / 1e9) * rng.normal(1.0, 0.02, sizes.size)
    fit = fit_alpha_beta(sizes, times)
    assert fit.alpha_s == pytest.approx(50e-6, rel=0.2)
    assert fit.bandwidth_bytes_per_s == pytest.approx(1e9, rel=0.05)
    assert fit.r2 > 0.99


def test_fit_keeps_alpha_non_negative():
    # Through the origin the unconstrained fit would give α < 0.
    sizes = [1e3, 1e6, 2e6]
    fit = fit_alpha_beta(sizes, [0.0, 1e-3, 2.1e-3])
    assert fit.alpha_s == 0.0 and fit.beta_s_per_byte > 0


def test_fit_keeps_beta_non_negative_and_reports_infinite_bandwidth():
    fit = fit_alpha_beta([1e3, 1e6], [2e-3, 1e-3])
    assert fit.beta_s_per_byte == 0.0 and fit.alpha_s == pytest.approx(1.5e-3)
    assert math.isinf(fit.bandwidth_bytes_per_s)


@pytest.mark.parametrize(("sizes", "times"), [([1024], [1e-5]), ([1024, 1024], [1e-5, 2e-5]), ([], [])])
def test_fit_rejects_fewer_than_two_distinct_sizes(sizes, times):
    with pytest.raises(MeshplanError, match="at least 2 distinct message sizes"):
        fit_alpha_beta(sizes, times)


def test_fit_rejects_mismatched_or_negative_input():
    with pytest.raises(MeshplanError, match="one time per size"):
        fit_alpha_beta([1, 2, 3], [1e-5, 2e-5])
    with pytest.raises(MeshplanError, match="non-negative"):
        fit_alpha_beta([1, 2], [1e-5, -2e-5])


def test_alphabeta_is_a_frozen_value():
    ab = AlphaBeta(1e-5, 1e-9, 1.0, 2)
    with pytest.raises(AttributeError):
        ab.alpha_s = 0.0  # type: ignore[misc]
    assert ab.bandwidth_bytes_per_s == pytest.approx(1e9)
