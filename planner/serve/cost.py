"""Forward-only latency and weight memory of a model on a serving group (pp stages × tp ranks).

A stage of n blocks at tp on a device kind takes, for one batch of b sequences of s tokens,
    n · block.forward_s + [embedding.forward_s] + [head.forward_s]     profile rows (planner.cost.completion:
                                                                      measured rows win, else the roofline estimate)
    + 2n · all-reduce(b·s·h·e bytes over tp)                           the two tp all-reduces of a block's forward
    + send of b·s·h·e bytes to the next stage                          (not on the last stage)
— the training cost model's terms without backward, optimizer or gradient sync — plus what a
serving system pays beyond the kernels, per device kind (`KindServing`, calibrated from the serving
runtime's per-request logs by planner/serve/calibrate.py): a fixed per-request front end (router →
first stage; it occupies the first stage) and reply (last stage → client; it delays only), a fixed
hand-off per stage boundary (header + activation through the runtime's send/recv), and tensor
parallelism that does not divide a block's compute by tp: a share `tp_serial` of it does not split
(Amdahl; kernels get smaller and less efficient, launches stay), so a block at tp takes
compute(1) · (1/tp + tp_serial · (1 − 1/tp)) plus its two all-reduces. A measured table
(`calibration`: seconds per stage measured on the serving ranks themselves, keyed by device kind,
model, pp, tp, batch: the ranks' own work, stage 0's parsing included) replaces the modelled
stage times of the configurations it has; the kind's front end and hand-offs are added to it.
Weights: a stage holds its blocks' (and the embedding's / head's) parameters / tp in the workload's
dtype; a group fits a set of models when every device's sum stays under its memory less the runtime
reserve.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.cost import formulas as F
from planner.cost.completion import ProfileNeed, complete_profiles
from planner.cost.devices import intra_link
from planner.measure.profiles import ProfileKey, ProfileTable
from planner.specs import flops
from planner.specs.cluster import ClusterSpec, NodeSpec
from planner.specs.flops import DTYPE_BYTES
from planner.specs.model import ModelSpec

# activations of a forward are transient: a few hidden-sized buffers per sequence, far below the
# weights; this share of device memory is left for them (and for the batching bound's inputs)
ACTIVATION_HEADROOM = 0.05


def stage_layers(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """Blocks [start, end) of each stage, as even as possible (the first stages take the remainder)."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append((start, start + n))
        start += n
    return out


@dataclass(frozen=True)
class Config:
    """A group's parallel configuration on one device kind."""

    kind: str
    pp: int
    tp: int

    @property
    def size(self) -> int:
        return self.pp * self.tp


@dataclass(frozen=True)
class KindServing:
    """What serving on one device kind pays beyond the kernels (module docstring), in seconds:
    `front_s` per request before the first stage's forward (it holds the first stage), `reply_s`
    after the last stage's (it delays the reply only), `handoff_s` per stage boundary, and the share
    of a block's compute that tensor parallelism does not split (0 = ideal 1/tp)."""

    front_s: float = 0.0
    reply_s: float = 0.0
    handoff_s: float = 0.0
    tp_serial: float = 0.0

    def tp_factor(self, tp: int) -> float:
        """compute(tp) / compute(1) of a block whose profile row is ideal 1/tp."""
        return 1.0 if tp <= 1 else (1 / tp + self.tp_serial * (1 - 1 / tp)) * tp


@dataclass
class ServeCost:
    """Stage times and weight bytes per (model, config, batch), memoised; `calibration` maps
    (device kind, model name, pp, tp, batch) to measured seconds per stage and wins over the cost
    model; `serving` holds each device kind's per-request, hand-off and tp-scaling figures."""

    cluster: ClusterSpec
    dtype: str = "fp16"
    profiles: ProfileTable | None = None
    calibration: dict[tuple[str, str, int, int, int], tuple[float, ...]] = field(default_factory=dict)
    serving: dict[str, KindServing] = field(default_factory=dict)
    _times: dict = field(default_factory=dict, repr=False)

    def kind_serving(self, kind: str) -> KindServing:
        return self.serving.get(kind, KindServing())

    def reply_s(self, kind: str) -> float:
        return self.kind_serving(kind).reply_s

    def node(self, kind: str) -> NodeSpec:
        return next(n for n in self.cluster.nodes if n.device_kind == kind)

    def supports(self, model: ModelSpec, cfg: Config) -> bool:
        """Whether the runtime can split `model` this way (tp divides heads, kv heads and ffn; a block per stage)."""
        tp = cfg.tp
        return (
            model.num_layers >= cfg.pp
            and model.num_heads % tp == 0
            and model.kv_heads % tp == 0
            and model.ffn % tp == 0
            and model.padded_vocab % tp == 0
        )

    def stage_times(self, name: str, model: ModelSpec, cfg: Config, batch: int, seq: int) -> tuple[float, ...]:
        key = (name, cfg, batch, seq)
        hit = self._times.get(key)
        if hit is not None:
            return hit
        k = (cfg.kind, name, cfg.pp, cfg.tp)
        measured = self.calibration.get((*k, batch))
        if measured is None and batch > 1 and (*k, 1) in self.calibration:
            measured = tuple(t * batch for t in self.calibration[(*k, 1)])  # linear in batch
        if measured is not None:  # the ranks' own work per stage: the front end and hand-offs come on top
            ks = self.kind_serving(cfg.kind)
            last = len(measured) - 1
            measured = tuple(
                t + (ks.front_s if s == 0 else 0.0) + (ks.handoff_s if s < last else 0.0)
                for s, t in enumerate(measured)
            )
        out = measured if measured is not None else self._modelled(model, cfg, batch, seq)
        self._times[key] = out
        return out

    def _modelled(self, model: ModelSpec, cfg: Config, batch: int, seq: int) -> tuple[float, ...]:
        need = ProfileNeed(batch, seq, cfg.tp, False, self.dtype)
        table = complete_profiles(model, self.cluster, self.profiles, [need], kinds=[cfg.kind])

        def fwd(layer: str) -> float:
            return table.lookup(ProfileKey(cfg.kind, layer, batch, seq, cfg.tp, False, self.dtype)).forward_s  # type: ignore[arg-type]

        node = self.node(cfg.kind)
        hidden_bytes = flops.block_input_bytes(model, batch, seq, self.dtype)
        link = intra_link(node)
        ar = F.allreduce_s(hidden_bytes, cfg.tp, link.bandwidth_bytes_per_s, link.latency_s) if cfg.tp > 1 else 0.0
        # stages of a group larger than a node cross nodes: the inter-node link prices their sends
        hop = node.inter_link if cfg.size > node.num_devices else node.intra_link
        send = F.p2p_s(hidden_bytes / cfg.tp, hop.bandwidth_bytes_per_s, hop.latency_s)
        ks = self.kind_serving(cfg.kind)
        f = ks.tp_factor(cfg.tp)
        block, emb, head = f * fwd("block"), f * fwd("embedding"), f * fwd("head")
        out = []
        for s, (a, b) in enumerate(stage_layers(model.num_layers, cfg.pp)):
            n = b - a
            t = n * (block + 2 * ar)
            t += emb + ks.front_s if s == 0 else 0.0
            t += head if s == cfg.pp - 1 else send + ks.handoff_s
            out.append(t)
        return tuple(out)

    def weight_bytes(self, model: ModelSpec, cfg: Config) -> float:
        """Bytes the most loaded device of the group holds for `model` (its largest stage / tp)."""
        e = DTYPE_BYTES[self.dtype]
        per = []
        for s, (a, b) in enumerate(stage_layers(model.num_layers, cfg.pp)):
            p = (b - a) * flops.layer_params("block", model, cfg.tp)
            p += flops.layer_params("embedding", model, cfg.tp) if s == 0 else 0
            p += flops.layer_params("head", model, cfg.tp) if s == cfg.pp - 1 else 0
            per.append(p * e)
        return max(per)

    def capacity_bytes(self, kind: str) -> float:
        """What one device of `kind` can give the models' weights."""
        mem = self.node(kind).memory_bytes
        return mem * (1 - ACTIVATION_HEADROOM) - F.runtime_reserve_bytes("cpu" if kind == "cpu" else kind)
