"""Catalog estimates: recompute never looks faster, the embedding's backward pays for its table."""

import pytest

from planner.measure.profiles import MEMORY_EFFICIENCY, ProfileKey, estimate_layer
from planner.specs.catalog import lookup
from planner.specs.model import get_model

A100 = lookup("A100-SXM4-80GB")


def _est(model, kind, mbs=1, recompute=False, tp=1):
    key = ProfileKey("A100-SXM4-80GB", kind, mbs, model.seq_len, tp, recompute, "bf16")
    return estimate_layer(model, key, A100.peak_flop_per_s("bf16"), A100.memory_bandwidth_bytes_per_s)


@pytest.mark.parametrize("name", ["tiny", "gpt2-small", "llama3-8b"])
@pytest.mark.parametrize("mbs", [1, 8])
def test_recompute_costs_time_and_saves_memory_never_the_reverse(name, mbs):
    m = get_model(name)
    plain, rc = _est(m, "block", mbs), _est(m, "block", mbs, recompute=True)
    assert rc.forward_s == plain.forward_s
    assert rc.backward_s == pytest.approx(plain.backward_s + plain.forward_s)
    assert rc.activation_bytes < plain.activation_bytes


def test_embedding_backward_is_bound_by_writing_its_gradient_table():
    m = get_model("llama3-8b")
    row = _est(m, "embedding")
    table_bytes = m.embedding_params() * 2
    assert row.backward_s >= 2 * table_bytes / (A100.memory_bandwidth_bytes_per_s * MEMORY_EFFICIENCY)
    assert row.activation_bytes == m.seq_len * 8  # token ids only
