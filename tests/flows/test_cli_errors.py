"""Every user mistake exits 1 with one line naming the problem and the fix — never a traceback."""

import subprocess
import sys

import pytest

from tests.support.cli import meshplan

BAD_CLUSTER = 'name = "x"\n[[nodes]]\nname = "a"\ndevice = "A100"\nnum_devices = 8\nintra_link = "nvlink3"\ninter_link = "ib-hdr"\n'
MIXED = "examples/clusters/mixed-a100-v100-t4.toml"


CASES = {
    "unknown model": (["plan", "--model", "gpt9", "--cluster", MIXED], ["model='gpt9'", "did you mean"]),
    "bad cluster file": (["plan", "--model", "tiny", "--cluster", "{bad}"], ["gpu='A100'", "did you mean A10"]),
    "missing cluster file": (["plan", "--model", "tiny", "--cluster", "nope.toml"], ["--cluster", "no such file"]),
    "infeasible plan": (
        ["plan", "--model", "gpt3-175b", "--cluster", MIXED],
        ["no feasible plan", "largest device has 40 GiB"],
    ),
    "never discovered": (["plan", "--model", "tiny"], ["never discovered", "meshplan discover"]),
    "unreadable plan": (["estimate", "--plan", "{garbage}", "--cluster", MIXED], ["not valid JSON", "re-export"]),
    "unknown plan id": (["train", "--plan-id", "deadbeef", "--steps", "2"], ["--plan-id='deadbeef'", "meshplan db"]),
    "bad override": (["--set", "train.steps=0", "run"], ["train.steps=0", "too small"]),
    "bad training flag": (["train", "--plan", "tests/data/plan_v1.json", "--lr", "0"], ["--lr=0.0", "greater than 0"]),
    "bad fault": (
        ["train", "--plan", "tests/data/plan_v1.json", "--slow-rank", "1", "--slow-factor", "0.5"],
        ["fault injection: slow_factor=0.5", "too small"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_mistake_is_one_line_with_the_fix(tmp_path, case):
    args, expected = CASES[case]
    (tmp_path / "bad.toml").write_text(BAD_CLUSTER)
    (tmp_path / "garbage.json").write_text("{garbage")
    args = [
        a.replace("{bad}", str(tmp_path / "bad.toml")).replace("{garbage}", str(tmp_path / "garbage.json"))
        for a in args
    ]
    if args[:1] == ["--set"]:
        out = subprocess.run(
            [sys.executable, "-m", "cli", *args[:2], "--state-dir", str(tmp_path), *args[2:]],
            capture_output=True,
            text=True,
            timeout=300,
        )
    else:
        out = meshplan(tmp_path, *args)
    assert out.returncode == 1, (out.stdout, out.stderr)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip() and "EventsWorker" not in ln]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    for text in expected:
        assert text in lines[0]
