"""RunSpec → argv → RunSpec: one round trip for every field (tests/support/runspec.py makes each one
off its default from its type), instead of a check per flag."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import MeshplanError
from planner.specs.config import TrainConfig, load_config
from planner.specs.runspec import RankSite, RunOptions, RunSpec, parse_rank_argv, rank_argv
from tests.support.runspec import all_off_default


def test_every_field_off_its_default_round_trips_through_the_rank_command_line():
    spec = RunSpec(**all_off_default(RunSpec))
    site = RankSite(**all_off_default(RankSite))
    assert all(getattr(spec, f) != RunSpec.model_fields[f].default for f in RunSpec.model_fields)
    argv = rank_argv(site, spec)
    assert len(argv) == 2 * (len(RunSpec.model_fields) + len(RankSite.model_fields))  # one flag a field
    assert parse_rank_argv(argv) == (site, spec)
    assert RunSpec.from_argv(spec.to_argv()) == spec


@settings(max_examples=40, deadline=None)
@given(st.sets(st.sampled_from(sorted(RunSpec.model_fields))))
def test_any_mix_of_set_and_default_fields_round_trips(names):
    spec = RunSpec(**all_off_default(RunSpec, names))
    assert len(spec.to_argv()) == 2 * len(names)  # defaults are not written: the rank has the same ones
    assert RunSpec.from_argv(spec.to_argv()) == spec


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--lr", "fast"], "argv: lr"),
        (["--stpes", "3"], "--stpes"),
        (["--steps", "0"], "argv: steps"),
        (["--faults", "{bad"], "--faults"),
        (["--steps"], "--steps"),
        (["steps", "3"], "argv"),
    ],
)
def test_a_bad_rank_flag_is_one_error_naming_it(argv, field):
    with pytest.raises(MeshplanError) as exc:
        parse_rank_argv(["--plan", "p", "--run-dir", "r", *argv])
    assert exc.value.field == field


def test_every_training_option_is_a_train_config_key_with_the_same_default():
    """`[train]` is RunOptions plus the launch knobs: every option settable there (and by --set)."""
    assert set(RunOptions.model_fields) < set(TrainConfig.model_fields)
    assert all(
        TrainConfig.model_fields[f].default == RunOptions.model_fields[f].default for f in RunOptions.model_fields
    )
    values = all_off_default(RunOptions)
    cfg = load_config(None, [f"train.{k}={json.dumps(v)}" for k, v in values.items()])
    assert cfg.train.options() == values
