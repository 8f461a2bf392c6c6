"""Fuzzed specs, plans and config files give a valid object or a MeshplanError — never another exception."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import MeshplanError
from planner.specs.config import load_config
from planner.specs.model import ModelSpec
from planner.specs.plan import parse_plan_json
from planner.validation import parse

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 70), st.floats(allow_nan=True), st.text(max_size=6))


@SETTINGS
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "name",
                "family",
                "num_layers",
                "hidden",
                "num_heads",
                "num_kv_heads",
                "ffn_hidden",
                "vocab_size",
                "seq_len",
                "tie_embeddings",
                "bogus",
            ]
        ),
        st.one_of(scalars, st.sampled_from(["gpt", "llama"]), st.sampled_from([2, 4, 8, 64, 128])),
    )
)
def test_model_spec_fuzz(data):
    try:
        m = parse(ModelSpec, data)
    except MeshplanError as e:
        assert e.field and e.fix
    else:
        assert m.hidden % m.num_heads == 0 and m.num_params() > 0


stage = st.fixed_dictionaries(
    {
        "layer_start": st.integers(-1, 5),
        "layer_end": st.integers(-1, 6),
        "device_ids": st.lists(st.integers(-1, 6), max_size=4),
    },
    optional={
        "tp": st.integers(0, 3),
        "dp": st.integers(0, 3),
        "recompute": st.sampled_from(["none", "full", "x"]),
        "sharding": st.sampled_from(["none", "zero3", "zero9"]),
    },
)


@SETTINGS
@given(
    st.fixed_dictionaries(
        {
            "model": st.just("tiny"),
            "cluster": st.just("c"),
            "global_batch_size": st.integers(-1, 9),
            "seq_len": st.integers(0, 64),
            "micro_batch_size": st.integers(0, 4),
            "stages": st.lists(stage, max_size=3),
            "batch_shares": st.lists(st.integers(-1, 8), max_size=3),
        },
        optional={
            "schedule": st.sampled_from(["1f1b", "gpipe", "interleaved-1f1b", "zb"]),
            "virtual_stages": st.integers(0, 3),
            "version": st.integers(0, 2),
            "junk": scalars,
        },
    )
)
def test_plan_json_fuzz(data):
    try:
        plan = parse_plan_json(json.dumps(data))
    except MeshplanError as e:
        assert e.field and e.fix
    else:
        assert sum(plan.batch_shares) == plan.global_batch_size
        assert parse_plan_json(plan.to_json()) == plan


@SETTINGS
@given(st.text(max_size=60), st.lists(st.text(max_size=20), max_size=3))
def test_config_text_and_overrides_fuzz(text, overrides):
    try:
        load_config(text, overrides)
    except MeshplanError as e:
        assert e.field is not None and e.fix
