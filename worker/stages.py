"""Stages of different widths: a mesh per stage and an explicit GPipe / 1F1B schedule.

torch.distributed.pipelining's PipelineStage exchanges activations over one pp process group with
one rank per stage, so it needs one tp and dp in every stage (one regular [pp, dp, tp]
DeviceMesh); uniform plans keep torch's schedules (worker/train.py). A plan whose stages differ in
tp or dp runs here instead:

- Meshes: stage s is a [dp_s, tp_s] DeviceMesh ("dp", "tp") over its own contiguous ranks
  (planner/runtime.py's rank map). DeviceMesh creates its groups with `new_group`, which is
  collective over the world, so every rank builds every stage's mesh, in stage order, and keeps
  its own. TP (DTensor), recompute and DP (GradSumSync / FSDP2) wrap a part exactly as in the
  uniform case, on that mesh; gradients are therefore synced per stage, over its dp group.
- Boundaries: a stage's activations are replicated across its tp ranks (TP blocks take and return
  plain replicated tensors, worker/parallel.apply_tp), so only each replica's tp-rank-0 leader
  talks across a boundary. It sends the samples that overlap each next-stage replica's slice
  (planner.runtime.boundary_pieces: equal dp sends replica r to replica r; stage dp 1 → 2 splits
  each micro-batch in halves), the receiving leader assembles its slice and broadcasts it over its
  tp group. Gradients return the same way, reversed. Both travel in fp32 (what the residual
  stream holds); a gradient is cast to its output's dtype on arrival.
- Schedule: "gpipe" runs every forward, then every backward; "1f1b" runs min(pp − 1 − s, M)
  warm-up forwards, then alternates one forward and one backward, then drains (Narayanan et al.,
  SC'21 §2.2). Sends never block, and a receive only waits on what the schedule's order has
  already produced upstream, so neither order can deadlock. A send is posted together with the
  next receive in one `batch_isend_irecv` (Megatron's send_forward_recv_backward): in 1F1B's steady
  state two neighbouring leaders each send before they receive from each other, and NCCL, which
  runs a communicator's operations in order, needs such a crossing pair grouped. Sends with no
  receive after them are posted at once. Tested on gloo; NCCL is untested here.
  Interleaving is not offered (planner/runtime.launch_problems refuses it for non-uniform plans).
- DP inside a stage: FSDP2 parts skip the gradient reduce-scatter on all but the last backward
  (`set_requires_gradient_sync`), as torch's schedules do; GradSumSync runs after the step.

Loss weighting is the uniform runtime's (worker/train.py): each last-stage slice loss is scaled by
slice / global batch (planner.runtime.loss_weight), so the summed gradient is the full-batch mean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from planner.runtime import Piece, boundary_pieces, loss_weight, slice_size, stage_ranks
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan
from worker.faults import Faults
from worker.model import loss_fn
from worker.telemetry import ComputeTimer

Action = tuple[str, int]  # ("F" | "B", micro-batch index)


def build_stage_mesh(plan: Plan, device_type: str, stage: int) -> DeviceMesh:
    """This rank's stage mesh [dp_s, tp_s]; collective: every rank builds all of them in order."""
    mine = None
    for s in range(plan.pp):
        mesh = DeviceMesh(device_type, torch.tensor(stage_ranks(plan, s)), mesh_dim_names=("dp", "tp"))
        if s == stage:
            mine = mesh
    assert mine is not None, f"stage {stage} is not a physical stage of the plan"
    return mine


def action_order(schedule: str, stage: int, pp: int, num_microbatches: int) -> list[Action]:
    """The order in which stage `stage` runs its forwards and backwards (see the module docstring)."""
    m = num_microbatches
    if schedule == "gpipe":
        return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
    warm = min(pp - 1 - stage, m)
    order: list[Action] = [("F", k) for k in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", k) for k in range(m - warm, m)]


def _mine(pieces: tuple[Piece, ...], rank: int, side: str, first_sample: int) -> list[tuple[int, int, int]]:
    """(peer, start, stop) of the pieces this rank sends (side "src") or receives ("dst"), with
    offsets into its own slice, which starts at `first_sample` of the micro-batch."""
    out = []
    for pc in pieces:
        if getattr(pc, side) == rank:
            peer = pc.dst if side == "src" else pc.src
            out.append((peer, pc.start - first_sample, pc.stop - first_sample))
    return sorted(out, key=lambda t: t[1])


class StagePipeline:
    """One rank's explicit schedule over a non-uniform plan; `step` takes what torch's schedules
    take (the pipeline replica's token rows on the first stage, `target` and `losses` on the last)."""

    def __init__(
        self,
        plan: Plan,
        spec: ModelSpec,
        stage: int,
        pipeline: int,
        slice_index: int,
        part: nn.Module,
        mesh: DeviceMesh,
        device: torch.device,
        timer: ComputeTimer,
        faults: Faults | None = None,
    ) -> None:
        self.part, self.device, self.spec = part, device, spec
        self.rank = dist.get_rank()
        pp = plan.pp
        self.first, self.last = stage == 0, stage == pp - 1
        self.mbs = plan.micro_batch_size
        self.size = slice_size(plan, stage)
        self.offset = slice_index * self.size  # this slice's first sample within a micro-batch
        self.seq = plan.seq_len
        self.weight = loss_weight(plan)
        tp_mesh = mesh["tp"]
        self.tp_group = tp_mesh.get_group() if tp_mesh.size() > 1 else None
        self.leader = int(tp_mesh.mesh.flatten()[0])
        is_leader = self.rank == self.leader
        self.recv_from = _mine(boundary_pieces(plan, stage - 1), self.rank, "dst", self.offset) if stage > 0 else []
        self.send_to = _mine(boundary_pieces(plan, stage), self.rank, "src", self.offset) if stage < pp - 1 else []
        assert is_leader or not (self.recv_from or self.send_to), "only tp leaders cross a boundary"
        self.order = action_order(plan.schedule, stage, pp, plan.num_microbatches(pipeline))
        self.faults = faults
        self._outbox: list[dist.P2POp] = []  # sends waiting to be batched with the next receive
        self._in_flight: list[tuple[list, list[dist.P2POp]]] = []
        fwd: Callable[..., Any] = self._compute_forward
        bwd: Callable[..., Any] = self._compute_backward
        if faults is not None and faults.compute_on:  # inside the timer: injected slowness is compute
            fwd, bwd = faults.wrap_compute(fwd, (stage, "forward")), faults.wrap_compute(bwd, (stage, "backward"))
        self._fwd, self._bwd = timer.wrap(fwd), timer.wrap(bwd)

    def _compute_forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.part(inp)

    def _compute_backward(self, out: torch.Tensor, grad: torch.Tensor | None) -> None:
        torch.autograd.backward(out, grad_tensors=grad)

    def _boundary_buffer(self) -> torch.Tensor:
        return torch.empty(self.size, self.seq, self.spec.hidden, dtype=torch.float32, device=self.device)

    def _post(self, receives: list[dist.P2POp]) -> None:
        """Post the queued sends with `receives` as one batch; wait for the receives only."""
        ops, self._outbox = self._outbox + receives, []
        if not ops:
            return
        works = dist.batch_isend_irecv(ops)
        if len(works) != len(ops):  # one work for the coalesced batch (NCCL)
            if receives:
                for work in works:
                    work.wait()
            else:
                self._in_flight.append((works, ops))
            return
        for work, op in zip(works, ops, strict=True):  # one work per operation (gloo)
            if op.op is dist.irecv:
                work.wait()  # once: a second wait on a gloo receive waits for another message
            else:
                self._in_flight.append(([work], [op]))  # a sent piece lives until its work is waited

    def _receive(self, peers: list[tuple[int, int, int]], tag: int) -> torch.Tensor:
        """This slice's activation (or gradient), assembled by the leader and broadcast over tp."""
        buf = self._boundary_buffer()
        self._post([dist.P2POp(dist.irecv, buf[lo:hi], peer, tag=tag) for peer, lo, hi in peers])
        if self.tp_group is not None:
            dist.broadcast(buf, src=self.leader, group=self.tp_group)
        return buf

    def _send(self, t: torch.Tensor, peers: list[tuple[int, int, int]], tag: int) -> None:
        for peer, lo, hi in peers:
            piece = t[lo:hi].detach().float().contiguous()
            if self.faults is not None:
                self.faults.delay_send(piece.numel() * piece.element_size())
            self._outbox.append(dist.P2POp(dist.isend, piece, peer, tag=tag))

    def _receives(self, action: Action | None) -> bool:
        """Whether `action` starts with a receive (which then posts the queued sends)."""
        return action is not None and not (self.first if action[0] == "F" else self.last)

    def step(self, *args: torch.Tensor, target: torch.Tensor | None = None, losses: list | None = None) -> None:
        self._outbox, self._in_flight = [], []
        saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        backwards = [k for kind, k in self.order if kind == "B"]
        fsdp = isinstance(self.part, FSDPModule)
        for n, (kind, k) in enumerate(self.order):
            if n and not self._receives((kind, k)):
                self._post([])  # nothing to batch the last action's sends with: post them now
            lo = k * self.mbs + self.offset  # this slice's rows of the pipeline's micro-batch k
            if kind == "F":
                if self.first:
                    inp = args[0][lo : lo + self.size]
                else:
                    inp = self._receive(self.recv_from, k).requires_grad_()
                out = self._fwd(inp)
                if self.last:
                    assert target is not None and losses is not None
                    out = loss_fn(out, target[lo : lo + self.size]) * self.weight
                    losses.append(out.detach())
                else:
                    self._send(out, self.send_to, k)
                saved[k] = (inp, out)
                continue
            inp, out = saved.pop(k)
            final = k == backwards[-1]
            if fsdp:  # accumulate locally; reduce-scatter once, in the last backward
                self.part.set_requires_gradient_sync(final)  # type: ignore[operator]
                self.part.set_is_last_backward(final)  # type: ignore[operator]
                self.part.set_reshard_after_backward(final)  # type: ignore[operator]
            grad = None if self.last else self._receive(self.send_to, k).to(out.dtype)
            self._bwd(out, grad)
            if not self.first:
                assert inp.grad is not None
                self._send(inp.grad, self.recv_from, k)
        self._post([])
        for works, _ in self._in_flight:
            for work in works:
                work.wait()
