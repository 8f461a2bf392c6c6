"""The schedule simulator agrees with the bubble formula and respects every dependency."""

import pytest

from planner.report.timeline import gantt, simulate


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("pp", "m"), [(1, 4), (2, 4), (4, 8), (4, 2)])
def test_equal_stages_take_m_plus_p_minus_1_slots(schedule, pp, m):
    f, b = 1.0, 2.0
    ops = simulate(schedule, [f] * pp, [b] * pp, m)
    assert max(o.end_s for o in ops) == pytest.approx((m + pp - 1) * (f + b))
    assert len(ops) == 2 * pp * m


def test_dependencies_and_one_op_at_a_time_per_stage():
    ops = simulate("1f1b", [1.0, 3.0, 1.0], [2.0, 6.0, 2.0], 5, p2p_s=0.1)
    at = {(o.kind, o.stage, o.microbatch): o for o in ops}
    for o in ops:
        if o.kind == "F" and o.stage > 0:
            assert o.start_s >= at[("F", o.stage - 1, o.microbatch)].end_s + 0.1 - 1e-12
        if o.kind == "B":
            assert o.start_s >= at[("F", o.stage, o.microbatch)].end_s
            if o.stage < 2:
                assert o.start_s >= at[("B", o.stage + 1, o.microbatch)].end_s + 0.1 - 1e-12
    for s in range(3):
        mine = sorted((o for o in ops if o.stage == s), key=lambda o: o.start_s)
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(mine, mine[1:], strict=False))


def test_1f1b_keeps_fewer_microbatches_in_flight_than_gpipe():
    def peak_in_flight(ops, stage):
        events = sorted(
            [(o.end_s, 1) for o in ops if o.stage == stage and o.kind == "F"]
            + [(o.end_s, -1) for o in ops if o.stage == stage and o.kind == "B"]
        )
        live = peak = 0
        for _, d in events:
            live += d
            peak = max(peak, live)
        return peak

    g, o = simulate("gpipe", [1.0] * 4, [2.0] * 4, 8), simulate("1f1b", [1.0] * 4, [2.0] * 4, 8)
    assert peak_in_flight(g, 0) == 8 and peak_in_flight(o, 0) == 4  # stage i of p holds p − i under 1F1B


def test_gantt_draws_one_row_per_stage():
    text = gantt(simulate("1f1b", [1.0, 1.0], [2.0, 2.0], 3))
    assert text.count("stage") == 2 and "0" in text and "a" in text
