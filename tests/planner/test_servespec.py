"""ServeSpec: what a serving rank is told, through the argv codec training's RunSpec uses."""

import pytest

from planner.errors import MeshplanError
from planner.specs.servespec import ServeSpec


def test_a_serve_spec_round_trips_through_argv_and_a_bad_flag_is_one_error() -> None:
    spec = ServeSpec(placement="/r/placement.json", router="127.0.0.1:4000", run_dir="/r", group=2, base_rank=3)
    argv = spec.to_argv()
    assert "--group" in argv and "--calib-reps" not in argv  # defaults stay off the command line
    assert ServeSpec.from_argv(argv) == spec
    assert spec.router_address == ("127.0.0.1", 4000)
    later = spec.model_copy(update={"generation": 1})
    assert ServeSpec.from_argv(later.to_argv()).generation == 1
    with pytest.raises(MeshplanError, match="--out-dir"):
        ServeSpec.from_argv([*argv, "--out-dir", "/x"])
    with pytest.raises(MeshplanError, match="calib_reps"):
        ServeSpec.from_argv([*argv, "--calib-reps", "0"])
