"""worker.parallel.apply_recompute(every=k) checkpoints blocks 0, k, 2k, … of a part (one process)."""

import torch

from planner.specs.model import get_model
from worker.model import Decoder, init_weights
from worker.parallel import apply_recompute


def saved_bytes(every: int | None) -> int:
    """Bytes autograd keeps after one forward of the tiny model (unique storages, as profile_layers counts)."""
    torch.manual_seed(0)
    spec = get_model("tiny")
    part = Decoder(spec)
    init_weights(part, 0, spec.num_layers)
    if every is not None:
        apply_recompute(part, "full", every)
    params = {p.untyped_storage().data_ptr() for p in part.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            kept[ptr] = t.untyped_storage().nbytes()
        return t

    tokens = torch.randint(0, spec.padded_vocab, (2, 32))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        part(tokens).sum().backward()
    return sum(kept.values())


def test_every_second_block_keeps_between_none_and_every_block():
    none, half, full = saved_bytes(None), saved_bytes(2), saved_bytes(1)
    assert none > half > full
    # 4 blocks: k = 2 checkpoints blocks 0 and 2, so it drops half of what full recompute drops
    assert abs((none - half) - (none - full) / 2) <= 0.05 * (none - full)
