"""The training progress display's arithmetic and cadence, on telemetry rows shaped like worker.train's.

(The end-to-end checks — a real torchrun job under `train_flow` and under `meshplan train` — are in
tests/flows/test_train_flow.py.)"""

import pytest

from launcher.progress import StepProgress


def _rows(step: int, step_time_s=(0.10, 0.12), loss=2.5, wall=None, pp=2) -> list[dict]:
    """One row per rank of a pp=2 plan: stage 0 (rank 0) carries the tokens, stage 1 (rank 1) the loss."""
    wall = float(step) if wall is None else wall
    return [
        {
            "run_id": "r",
            "rank": r,
            "stage": r,
            "replica": 0,
            "tp_index": 0,
            "pp": pp,
            "dp": 1,
            "tp": 1,
            "samples": 8,
            "tokens": 8 * 32,
            "step": step,
            "step_time_s": step_time_s[r],
            "loss": loss if r == pp - 1 else None,
            "wall_time_s": wall,
        }
        for r in range(pp)
    ]


def test_a_step_counts_as_done_once_every_rank_reported_it(capsys):
    p = StepProgress(10, enabled=False)
    first, second = _rows(0)
    assert p.update([first]) is None  # rank 1 has not finished step 0 yet
    s = p.update([second])
    assert (s.done, s.total, s.step) == (1, 10, 0)
    assert s.step_time_s == 0.12  # the slowest rank, as run_steps defines it
    assert s.loss == 2.5 and s.tokens_per_s == pytest.approx(256 / 0.12)
    assert capsys.readouterr().out == ""  # disabled: computes, shows nothing


def test_loss_is_share_weighted_over_replicas_and_eta_follows_wall_time():
    p = StepProgress(5, enabled=False)
    rows = [
        {
            "rank": r,
            "stage": 0,
            "tp_index": 0,
            "pp": 1,
            "dp": 2,
            "tp": 1,
            "samples": n,
            "tokens": n * 32,
            "step": 0,
            "step_time_s": 0.1,
            "loss": loss,
            "wall_time_s": 100.0,
        }
        for r, (n, loss) in enumerate([(6, 1.0), (2, 3.0)])
    ]
    s = p.update(rows)
    assert s.loss == pytest.approx((6 * 1.0 + 2 * 3.0) / 8) and s.tokens_per_s == pytest.approx(256 / 0.1)
    assert s.eta_s == pytest.approx(4 * 0.1)  # one step seen: its step time
    s = p.update([{**r, "step": 1, "wall_time_s": 102.0} for r in rows])
    assert s.done == 2 and s.eta_s == pytest.approx(3 * 2.0)  # 2 s of wall time per step, 3 steps to go


def test_plain_lines_every_n_steps_and_one_at_the_end(capsys):
    with StepProgress(5, every_steps=2, every_s=1e9, terminal=False) as p:
        for step in range(5):
            p.update(_rows(step))
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in out] == ["train: steps 2/5", "train: steps 4/5", "train: steps 5/5"]
    assert out[-1] == "train: steps 5/5 (100%) | loss 2.5000 | step 120.0 ms | 2,133 tok/s | ETA 0:00:00"


def test_several_steps_in_one_poll_show_only_the_newest(capsys):
    with StepProgress(4, every_steps=1, terminal=False) as p:
        p.update(_rows(0) + _rows(1) + _rows(2)[:1])  # step 2 is only half reported
    assert capsys.readouterr().out.startswith("train: steps 2/4 (50%)")


def test_a_restart_from_a_checkpoint_moves_the_count_back():
    p = StepProgress(10, enabled=False)
    for step in range(6):
        p.update(_rows(step))
    s = p.update(_rows(4, wall=50.0))  # torchrun restarted the job from its step-4 checkpoint
    assert s.done == 5 and s.eta_s == pytest.approx(5 * 0.12)  # the old wall times no longer apply


def test_after_a_relayout_the_new_world_completes_steps():
    p = StepProgress(6, enabled=False)
    for step in range(3):
        p.update(_rows(step, step_time_s=(0.1,) * 4, pp=4))
    assert p.update(_rows(3, step_time_s=(0.1,) * 3, pp=3)[:2]).done == 3  # 2 of the 3 new ranks: not yet
    assert p.update(_rows(3, step_time_s=(0.1,) * 3, pp=3)[2:]).done == 4


def test_on_a_terminal_it_is_a_rich_bar(capsys):
    with StepProgress(3, terminal=True) as p:
        for step in range(3):
            p.update(_rows(step))
    out = capsys.readouterr().out
    assert "\x1b[" in out and "3/3" in out and "loss 2.5000" in out and "train: steps" not in out


def test_only_a_real_terminal_gets_the_bar(capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # CI setups set it; their logs are still not a terminal
    with StepProgress(1) as p:
        p.update(_rows(0))
    assert capsys.readouterr().out.startswith("train: steps 1/1 (100%)")


def test_working_shows_one_plain_line_before_a_long_call_when_not_on_a_terminal(capsys):
    from launcher.progress import working

    with working("plan: searching x"):
        print("inside")
    assert capsys.readouterr().out.splitlines() == ["plan: searching x", "inside"]
