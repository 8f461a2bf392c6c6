"""Single-process reference: the full Decoder trained on the identical global batches.

The parallel runtime must reproduce this (to floating-point tolerance) under every plan: it sees the
same global batch per step (worker/data.py), starts from the same name-seeded weights, and its
weighted, summed gradient equals this full-batch mean gradient.
"""

from __future__ import annotations

import torch

from planner.specs.model import ModelSpec
from worker.data import DataSource, batch_rows
from worker.model import Decoder, init_weights, loss_fn
from worker.options import make_optimizer


def train_reference(
    spec: ModelSpec,
    global_batch: int,
    seq_len: int,
    steps: int,
    data: DataSource = "synthetic",
    seed: int = 0,
    lr: float = 0.1,
    optimizer: str = "sgd",
    start: tuple[int, dict[str, torch.Tensor]] | None = None,
    grad_clip_norm: float = 0.0,
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Parameters after `steps` steps and the loss of each step (before its update).

    `grad_clip_norm` > 0 clips by hand (not torch's clip_grad_norm_, which worker/clip.py builds on):
    every gradient scaled by min(1, c / (‖g‖ + 1e-6)), ‖g‖ the 2-norm of all gradients together.

    `start=(step, params)` continues from saved parameters with a *fresh* optimizer — what a resume
    that lost the optimizer state would do; tests use it to show their tolerance would catch that.
    """
    model = Decoder(spec)
    init_weights(model, seed, spec.num_layers)
    first = 0
    if start is not None:
        first = start[0]
        model.load_state_dict(start[1])
    opt = make_optimizer(model.parameters(), optimizer, lr)
    losses = []
    for step in range(first, steps):
        x, y = batch_rows(data, step, range(global_batch), global_batch, seq_len, spec.vocab_size, seed)
        loss = loss_fn(model(x), y)
        loss.backward()
        if grad_clip_norm:
            norm = sum(float((p.grad.double() ** 2).sum()) for p in model.parameters() if p.grad is not None) ** 0.5
            for p in model.parameters():
                if p.grad is not None:
                    p.grad *= min(1.0, grad_clip_norm / (norm + 1e-6))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses
