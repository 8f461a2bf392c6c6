"""FaultSpec: one validated value for every injected fault, serialised once and parsed once."""

from __future__ import annotations

import pytest

from planner.errors import MeshplanError
from planner.specs.faults import NO_FAULTS, FaultSpec


def test_the_rank_argument_round_trips_and_leaves_out_defaults():
    spec = FaultSpec(slow_rank=1, slow_factor=2.5, slow_from_step=4, link_rank=0, link_s_per_msg=0.03, kill_rank=3)
    arg = spec.to_arg()
    assert FaultSpec.from_arg(arg) == spec
    assert "link_s_per_mib" not in arg and "kill_step" not in arg
    assert FaultSpec.from_arg("") == NO_FAULTS and not NO_FAULTS.any_on


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"slow_rank": 1, "slow_factor": 0.5}', "--faults: slow_factor"),
        ('{"link_rank": 0, "link_s_per_mib": -1}', "--faults: link_s_per_mib"),
        ('{"slow_rank": 1, "slow_facter": 2}', "--faults: slow_facter"),
        ('{"slow_factor": 2}', "slow_rank"),  # a slowdown of no rank would silently do nothing
        ('{"link_s_per_msg": 0.1}', "link_rank"),
        ("slow_rank=1", "--faults"),
    ],
)
def test_a_bad_fault_names_its_field(text, field):
    with pytest.raises(MeshplanError) as exc:
        FaultSpec.from_arg(text)
    assert exc.value.field == field


def test_a_relaunch_moves_each_fault_with_its_device_or_drops_it():
    spec = FaultSpec(slow_rank=2, slow_factor=3.0, link_rank=1, link_s_per_mib=0.5, kill_rank=0, kill_step=7)
    moved = spec.relabelled({2: 0, 1: 1})  # device 2 is now rank 0; device 0 left the run
    assert (moved.slow_rank, moved.slow_factor, moved.link_rank, moved.link_s_per_mib) == (0, 3.0, 1, 0.5)
    assert not moved.kill_on
    gone = spec.relabelled({0: 0})
    assert not gone.compute_on and not gone.link_on and gone.kill_rank == 0
    assert gone.slow_factor == 1.0 and gone.slow_rank == -1
