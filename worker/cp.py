"""Context parallelism in the torch runtime: K and V all-gathered over the cp group (Llama 3's CP).

Why not torch's `torch.distributed.tensor.experimental.context_parallel`: on CPU ranks torch 2.13
refuses it (`aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding
strategy registered`; its ring attention dispatches only the CUDA flash / efficient kernels), and
the buffers it shards in place cannot require grad.

Each cp rank holds the tokens at `planner.runtime.cp_positions` (chunks c and 2·cp − 1 − c of
2·cp, so every rank gets the same share of the causal work). In every attention layer it projects
q, k, v for its tokens (RoPE / learned positions at their global positions), all-gathers k and v
over the cp group with the autograd-aware functional collective (its backward reduce-scatters dK,
dV to their owners), and masks by global positions (query i sees key j iff pos_i ≥ pos_j). The rest
of a block is per token and needs nothing. Parameters are replicated over cp; their gradients are
summed over dp × cp (worker.parallel.apply_dp on the flattened mesh), and each rank's token-mean
loss is weighted 1/cp more (planner.runtime.loss_weight), so the update is the full-batch one.
planner.cost prices exactly this exchange (formulas.cp_kv_exchange_s).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from planner.runtime import cp_positions
from worker.model import Decoder


class KvGather:
    """What one attention layer of a cp rank needs: its tokens' positions, the mask by global
    positions over the gathered keys, and the all-gather of k / v (b, heads, s/cp, d) over the group."""

    def __init__(self, group: dist.ProcessGroup, cp: int, index: int, seq_len: int, device: torch.device) -> None:
        self.group = group
        self.positions = torch.tensor(cp_positions(seq_len, cp, index), device=device)
        keys = torch.tensor([p for c in range(cp) for p in cp_positions(seq_len, cp, c)], device=device)
        self.mask = self.positions[:, None] >= keys[None, :]  # gathered keys come in rank order

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return funcol.all_gather_tensor_autograd(t.contiguous(), gather_dim=2, group=self.group)


def apply_cp(
    part: Decoder, group: dist.ProcessGroup, cp: int, index: int, seq_len: int, device: torch.device
) -> torch.Tensor:
    """Make `part` run cp rank `index`'s tokens; returns their positions (to slice inputs and targets)."""
    gather = KvGather(group, cp, index, seq_len, device)
    for block in part.blocks.values():
        block.attn.kv_gather = gather
    if part.embed is not None:
        part.embed.positions = gather.positions
    return gather.positions
