"""Layer profiles the cost model prices plans from: measured rows, or catalog estimates when absent.

A `LayerProfile` is one (device kind, layer kind, micro-batch size, seq, tp, dtype, recompute)
measurement: forward and backward seconds, parameter bytes, the bytes a micro-batch keeps alive
for backward, and the extra working bytes at the layer's peak. A `ProfileTable` answers lookups;
measured rows always win over estimates. For device kinds never measured, `estimate_layer` derives
a row from FLOP and byte counts against the device's datasheet peaks, scaled by an efficiency
(achieved / peak) calibrated on measured devices where possible (`fit_block_efficiency`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from planner.specs import flops
from planner.specs.flops import DTYPE_BYTES, LayerKind
from planner.specs.model import ModelSpec

# Achieved/peak matmul efficiency when no device has been measured: ~0.5 of dense bf16 peak is what
# Megatron-LM reports per GPU for GPT-3-class blocks on A100 (Narayanan et al. SC'21, Table 1: 44–52%
# MFU incl. communication), so compute alone sits a little above that.
DEFAULT_EFFICIENCY = 0.55
# The embedding and head are memory-bound gathers/softmax on top of their matmuls; this factor of
# extra time per byte moved is the conventional roofline treatment.
MEMORY_EFFICIENCY = 0.7


@dataclass(frozen=True, slots=True)
class ProfileKey:
    device_kind: str
    layer_kind: LayerKind
    micro_batch_size: int
    seq_len: int
    tp: int
    recompute: bool
    dtype: str


@dataclass(frozen=True, slots=True)
class LayerProfile:
    key: ProfileKey
    forward_s: float
    backward_s: float
    param_bytes: int
    activation_bytes: int
    workspace_bytes: int
    estimated: bool
    efficiency: float | None = None
    forward_spread_s: float = 0.0
    backward_spread_s: float = 0.0
    # timed on a real tp group: the times include the block's tp all-reduces (worker.layer_bench)
    tp_comm_included: bool = False

    @property
    def train_s(self) -> float:
        """Forward + backward (backward includes the recomputed forward when recompute is on)."""
        return self.forward_s + self.backward_s


@dataclass(frozen=True, slots=True)
class CommFit:
    """α–β cost of one collective on one link class: time(bytes) = alpha_s + beta_s_per_byte · bytes.

    `op` is all_reduce, all_gather, reduce_scatter or send_recv; bytes follow nccl-tests (whole
    buffer). `measured` is False when the fit comes from a link's datasheet figures, not a bench.
    """

    link_kind: str
    op: str
    alpha_s: float
    beta_s_per_byte: float
    measured: bool = True
    r2: float | None = None

    def time_s(self, num_bytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * num_bytes


class MissingProfileError(LookupError):
    """No measured or estimable profile for a key."""


class ProfileTable:
    """Lookup of layer profiles by key; measured rows shadow estimated ones."""

    def __init__(self, rows: Iterable[LayerProfile] = ()) -> None:
        self._rows: dict[ProfileKey, LayerProfile] = {}
        for r in rows:
            self.add(r)

    def add(self, row: LayerProfile) -> None:
        old = self._rows.get(row.key)
        if old is None or old.estimated or not row.estimated:
            self._rows[row.key] = row

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self):
        return iter(self._rows.values())

    def fingerprint(self) -> str:
        """Stable id of the rows (order-independent), for cache keys and provenance."""
        import hashlib

        rows = sorted(repr(r) for r in self._rows.values())
        return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]

    def device_kinds(self) -> set[str]:
        return {k.device_kind for k in self._rows}

    def get(self, key: ProfileKey) -> LayerProfile | None:
        return self._rows.get(key)

    def lookup(self, key: ProfileKey) -> LayerProfile:
        """Exact row, else one scaled linearly in micro-batch size from the nearest measured mbs."""
        row = self._rows.get(key)
        if row is not None:
            return row
        near = [r for k, r in self._rows.items() if replace(k, micro_batch_size=key.micro_batch_size) == key]
        if not near:
            raise MissingProfileError(key)
        best = min(near, key=lambda r: abs(r.key.micro_batch_size - key.micro_batch_size))
        f = key.micro_batch_size / best.key.micro_batch_size
        return replace(
            best,
            key=key,
            forward_s=best.forward_s * f,
            backward_s=best.backward_s * f,
            activation_bytes=int(best.activation_bytes * f),
            workspace_bytes=int(best.workspace_bytes * f),
            estimated=True,
        )


def estimate_layer(
    model: ModelSpec,
    key: ProfileKey,
    peak_flop_per_s: float,
    memory_bandwidth_bytes_per_s: float,
    efficiency: float = DEFAULT_EFFICIENCY,
) -> LayerProfile:
    """A roofline estimate: time = max(FLOPs / (peak × efficiency), bytes / (bandwidth × 0.7)).

    Backward is 2× forward FLOPs (weight and input gradients); recompute adds one forward to the
    backward pass. Activation bytes follow flops.block_activation_bytes; with full recompute a block
    keeps only its input. Bytes moved by a forward: the parameters once plus every activation it
    produces written and read once — the same with or without recompute, which only changes what
    is *kept*. The embedding is a gather: it keeps only its token ids, and its backward writes the
    whole dense gradient table (PyTorch's default non-sparse embedding), so it is memory-bound on
    the table's size however small the batch.
    """
    b, s, t, e = key.micro_batch_size, key.seq_len, key.tp, DTYPE_BYTES[key.dtype]
    fwd_flops = flops.forward_flops(key.layer_kind, model, b, s, t)
    param_bytes = flops.layer_params(key.layer_kind, model, t) * e
    hidden = flops.block_input_bytes(model, b, s, key.dtype)
    if key.layer_kind == "block":
        produced = flops.block_activation_bytes(model, b, s, t, key.dtype)
        act = hidden if key.recompute else produced
        # what worker.layer_bench measures on CPU: the two largest transients (an output and its
        # gradient) plus, under recompute, the block's saved set rebuilt in backward
        work = 2 * flops.largest_activation_bytes(model, b, s, t, key.dtype) + (produced if key.recompute else 0.0)
    elif key.layer_kind == "head":
        # meshplan's runtime loss (worker.model.loss_fn): F.cross_entropy on an fp32 copy of the
        # logits (flops.loss_logit_bytes "torch"); other stacks' kernels: planner.cost.memory
        elems = b * s * model.padded_vocab / t
        kept, extra = flops.loss_logit_bytes("torch", key.dtype)
        produced = act = hidden + elems * kept
        work = elems * extra
    else:
        produced, act, work = hidden, b * s * 8, hidden  # int64 token ids kept
    bw = memory_bandwidth_bytes_per_s * MEMORY_EFFICIENCY
    fwd = max(fwd_flops / (peak_flop_per_s * efficiency), (param_bytes + 2 * produced) / bw)
    if key.layer_kind == "embedding":
        bwd = (2 * param_bytes + 2 * hidden) / bw  # zero the table's gradient, scatter-add into it
    else:
        bwd = 2 * fwd + (fwd if key.recompute else 0.0)
    return LayerProfile(
        key=key,
        forward_s=fwd,
        backward_s=bwd,
        param_bytes=int(param_bytes),
        activation_bytes=int(act),
        workspace_bytes=int(work),
        estimated=True,
        efficiency=efficiency,
    )


def achieved_efficiency(model: ModelSpec, row: LayerProfile, peak_flop_per_s: float) -> float:
    """Achieved / peak FLOP rate of a measured block row (forward + backward, no recompute)."""
    k = row.key
    work = flops.training_flops(k.layer_kind, model, k.micro_batch_size, k.seq_len, k.tp, k.recompute)
    return work / row.train_s / peak_flop_per_s


def fit_block_efficiency(model: ModelSpec, measured: Iterable[tuple[LayerProfile, float]]) -> float:
    """Median achieved efficiency of measured block rows given (row, that device's peak FLOP/s).

    Falls back to DEFAULT_EFFICIENCY when nothing was measured.
    """
    effs = sorted(
        achieved_efficiency(model, r, peak) for r, peak in measured if r.key.layer_kind == "block" and not r.estimated
    )
    if not effs:
        return DEFAULT_EFFICIENCY
    return effs[len(effs) // 2]
