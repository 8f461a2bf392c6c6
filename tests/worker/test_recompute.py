"""Recompute modes in one process: same gradients; selective re-runs only the attention core."""

import pytest
import torch

import worker.model as wm
from planner.specs.model import get_model
from worker.model import Decoder, init_weights, loss_fn
from worker.parallel import apply_recompute

TINY = get_model("tiny")


def _run(mode: str, monkeypatch) -> tuple[dict[str, torch.Tensor], int, int]:
    torch.manual_seed(0)
    model = Decoder(TINY)
    init_weights(model, 0, TINY.num_layers)
    apply_recompute(model, mode)
    calls = {"core": 0, "wq": 0}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(*a, **k):
        calls["core"] += 1
        return sdpa(*a, **k)

    monkeypatch.setattr(wm.F, "scaled_dot_product_attention", counted)
    for block in model.blocks.values():
        block.attn.wq.register_forward_hook(lambda *_: calls.__setitem__("wq", calls["wq"] + 1))
    x = torch.randint(0, TINY.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    loss_fn(model(x), x).backward()
    monkeypatch.undo()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, calls["core"], calls["wq"]


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_keeps_the_gradients_and_reruns_what_it_says(mode, monkeypatch):
    ref, core0, wq0 = _run("none", monkeypatch)
    grads, core, wq = _run(mode, monkeypatch)
    assert all(torch.allclose(grads[n], ref[n], atol=1e-6) for n in ref)
    n = TINY.num_layers
    assert (core0, wq0) == (n, n)
    assert core == 2 * n  # the core runs again in backward under both modes
    assert wq == (n if mode == "selective" else 2 * n)  # selective keeps the projections' inputs
