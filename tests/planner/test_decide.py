"""The decision gate switches only when the gain beats the switch cost, and never flaps."""

from planner.replan.gate import GateConfig, Option, decide


def test_switches_when_gain_times_remaining_beats_cost():
    d = decide(2.0, [Option("relayout", 1.2, switch_cost_s=30.0)], remaining_steps=100)
    assert d.switch and d.chosen.action == "relayout"
    assert abs(d.net_gain_s - (0.8 * 100 - 30)) < 1e-9


def test_keeps_when_too_few_steps_remain_to_pay_back():
    d = decide(2.0, [Option("relayout", 1.2, switch_cost_s=30.0)], remaining_steps=30)
    assert not d.switch and "nets" in d.reason


def test_cheaper_action_wins_when_it_nets_more():
    opts = [Option("rebalance", 1.5, 0.1), Option("relayout", 1.4, 60.0)]
    assert decide(2.0, opts, remaining_steps=100).chosen.action == "rebalance"
    assert decide(2.0, opts, remaining_steps=10_000).chosen.action == "relayout"


def test_hysteresis_ignores_marginal_gains():
    d = decide(1.00, [Option("rebalance", 0.97, 0.0)], remaining_steps=1_000_000)
    assert not d.switch


def test_cooldown_prevents_flapping():
    cfg = GateConfig(cooldown_steps=5)
    opts = [Option("rebalance", 1.0, 0.0)]
    assert not decide(2.0, opts, 100, steps_since_switch=2, cfg=cfg).switch
    assert decide(2.0, opts, 100, steps_since_switch=5, cfg=cfg).switch
