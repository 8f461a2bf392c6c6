"""Straggler detection: clean runs and blips never trigger; persistent slowdowns are found fast."""

import random

import pytest

from planner.replan.detect import DetectConfig, StepSample, detect


def _run(
    steps=30, ranks=4, slow_rank=None, factor=2.0, from_step=15, blip_step=None, link_rank=None, noise=0.03, seed=0
):
    """Synthetic synchronous training: step time = slowest rank's compute + transfer."""
    rng = random.Random(seed)
    out = []
    for st in range(steps):
        comp = {}
        for r in range(ranks):
            c = 0.100 * (1 + rng.gauss(0, noise))
            if r == slow_rank and st >= from_step:
                c *= factor
            if st == blip_step and r == 0:
                c *= 3.0
            comp[r] = c
        slowest = max(comp.values())
        for r in range(ranks):
            xfer = 0.020 * (1 + rng.gauss(0, noise))
            if r == link_rank and st >= from_step:
                xfer *= factor
            comm = (slowest - comp[r]) + xfer
            out.append(StepSample(st, r, comp[r] + comm, comp[r], comm))
    return out


def test_clean_run_triggers_nothing():
    for seed in range(20):
        assert not detect(_run(seed=seed)).any


def test_a_one_step_blip_never_triggers():
    assert not detect(_run(blip_step=20)).any


@pytest.mark.parametrize("factor", [1.5, 2.0, 4.0])
def test_slow_rank_detected_within_persistence_steps_with_factor(factor):
    cfg = DetectConfig(persistence=3)
    d = detect(_run(slow_rank=2, factor=factor, from_step=15), cfg)
    compute = [s for s in d.slowdowns if s.kind == "compute"]
    assert [s.rank for s in compute] == [2]
    s = compute[0]
    assert s.since_step == 15 and 15 < s.detected_at_step <= 15 + cfg.persistence - 1  # rolling median: a majority
    assert abs(s.factor - factor) / factor < 0.15
    # the other ranks only waited: no link slowdown is blamed on them
    assert not d.link_factors()


def test_slow_link_is_told_apart_from_slow_compute():
    d = detect(_run(link_rank=1, factor=3.0, from_step=12))
    assert not d.compute_factors()
    assert list(d.link_factors()) == [1]
    assert abs(d.link_factors()[1] - 3.0) / 3.0 < 0.15


def test_too_few_steps_means_no_verdict():
    d = detect(_run(steps=6, slow_rank=0, from_step=3))
    assert not d.any and d.steps_seen == 4
