"""A serving rank: one tp shard of one pipeline stage of every model its group hosts, forward passes only.

`python -m worker.agent --nproc-per-node N -m worker.serve --placement P --router HOST:PORT --out-dir D`
(tasks/serve.py starts it). Ranks are numbered group by group, stage by stage, tp index by tp index,
in the placement's order.

Tensor parallelism (a group's tp > 1): each stage is tp ranks built from the same Decoder weights
(worker/model.py, seeded by name) and split Megatron-style with DTensor (worker/parallel.apply_tp:
q/k/v and w1/w3 column-split, wo and w2 row-split, an all-reduce over the stage's tp ranks after
each), the token embedding and the head over the vocabulary (the head's logits all-gathered): what
the serving cost model prices (weights / tp, two all-reduces per block). A stage's input and output
are whole on every one of its tp ranks, so a stage boundary needs no gather: tp rank i of stage s
sends to tp rank i of stage s + 1. Only the first stage's tp rank 0 (the group's lead) talks to the
router: it forwards each request it admits (header, then tokens) to its tp peers with sends, and only
the last stage's tp rank 0 reports requests done.

After building its stages each rank times its stage of every hosted model (all ranks at once, so the
contention of the serving run is in the figure); tp rank 0 of each stage writes `calib_rank<R>.json`:
the simulator's calibrated per-stage times. Then, per group, the lead connects to the router (the
flow process's request front end) and reads requests, one JSON line each; it drops a request whose
predicted finish passes its deadline, else embeds it, runs its blocks and sends a header (op, model,
request id, tokens) and the activation to the next stage; the last stage runs the head and reports
the request done on its own router connection. tp rank 0 of each stage also logs every request's
service seconds, from taking it to handing it on (`stage_rank<R>.json`), the service times the
simulator is calibrated with after a replay (the start-up figure is timed with every rank busy at
once). Stages work on different requests at once: pipelined execution, FCFS. A stop line ends the
group's pipeline; every rank then meets the others at a barrier before the process group is
destroyed (gloo's exit abort, STACK.md §1.3).

Devices: gloo on CPU. Where CUDA is present and a group's device kind is not "cpu", its ranks run
on cuda:LOCAL_RANK with NCCL for the activations and tp collectives (headers and tokens stay on
gloo, "cpu:gloo,cuda:nccl").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from planner.serve.cost import stage_layers
from planner.serve.placement import Placement
from worker.model import Decoder, init_weights
from worker.parallel import apply_tp

RUN, STOP = 1, 0
CPU = torch.device("cpu")


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--placement", required=True)
    ap.add_argument("--router", required=True, help="HOST:PORT of the request front end")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--calib-reps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    return ap.parse_args()


@dataclass(frozen=True)
class Place:
    """Where a rank sits: its group, stage, tp index, and the group's first rank."""

    group: int
    stage: int
    tp_index: int
    base: int
    pp: int
    tp: int

    def rank(self, stage: int, tp_index: int = 0) -> int:
        """The global rank of (stage, tp index) in this rank's group."""
        return self.base + stage * self.tp + tp_index

    @property
    def tp_ranks(self) -> list[int]:
        return [self.rank(self.stage, t) for t in range(self.tp)]


def my_place(pl: Placement, rank: int) -> Place:
    base = 0
    for gi, g in enumerate(pl.groups):
        if rank < base + g.pp * g.tp:
            stage, t = divmod(rank - base, g.tp)
            return Place(gi, stage, t, base, g.pp, g.tp)
        base += g.pp * g.tp
    raise SystemExit(f"rank {rank} has no group: the placement has {base} devices")


def device_of(pl: Placement, gi: int) -> torch.device:
    if pl.groups[gi].kind != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def tp_meshes(pl: Placement, me: Place) -> DeviceMesh | None:
    """This rank's stage tp mesh (None at tp = 1); collective: every rank builds every stage's mesh
    of tp > 1, in the placement's order (process groups are created by all ranks together)."""
    mine, base = None, 0
    for gi, g in enumerate(pl.groups):
        for s in range(g.pp):
            ranks = [base + s * g.tp + t for t in range(g.tp)]
            if g.tp > 1:
                mesh = DeviceMesh(device_of(pl, gi).type, torch.tensor(ranks), mesh_dim_names=("tp",))
                if gi == me.group and s == me.stage:
                    mine = mesh
        base += g.pp * g.tp
    return mine


def shard(part: Decoder, mesh: DeviceMesh) -> None:
    """Split a stage over its tp ranks, forward-only: blocks as training does (apply_tp), the token
    embedding row-split over the vocabulary (its partial sums all-reduced), the head column-split
    (its logits all-gathered). Inputs and outputs stay whole plain tensors on every tp rank."""
    apply_tp(part, part.spec, mesh)
    if part.embed is not None:
        parallelize_module(part.embed, mesh, {"tok": RowwiseParallel(input_layouts=Replicate())})
    if part.head is not None:
        parallelize_module(part.head, mesh, {"out": ColwiseParallel(output_layouts=Replicate())})


def build(
    pl: Placement, gi: int, stage: int, seed: int, mesh: DeviceMesh | None = None, device: torch.device | None = None
) -> dict[str, Decoder]:
    """Stage `stage` of every model group `gi` hosts, split over `mesh` (its tp ranks) when given."""
    g = pl.groups[gi]
    specs = {m.name: m for m in pl.models}
    out = {}
    for name in g.models:
        spec = specs[name].spec
        a, b = stage_layers(spec.num_layers, g.pp)[stage]
        part = Decoder(spec, (a, b), first=stage == 0, last=stage == g.pp - 1)
        init_weights(part, seed, spec.num_layers)  # the whole stage's weights on the host, then this rank's
        if mesh is not None:  # shards go to the mesh's device one parameter at a time (DTensor), the rest after
            shard(part, mesh)
        out[name] = part.to(device or CPU).eval()
    return out


def stage_input(pl: Placement, name: str, stage: int, device: torch.device) -> torch.Tensor:
    sm = next(m for m in pl.models if m.name == name)
    if stage == 0:
        return torch.zeros(sm.batch, sm.tokens, dtype=torch.long, device=device)
    return torch.zeros(sm.batch, sm.tokens, sm.spec.hidden, device=device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def calibrate(
    pl: Placement, parts: dict[str, Decoder], stage: int, reps: int, device: torch.device
) -> dict[str, float]:
    """Median seconds of this stage's forward per hosted model (after one warm-up); the tp ranks of a
    stage run it together (their collectives pair up: same models, same order, same reps)."""
    out = {}
    with torch.no_grad():
        for name, part in parts.items():
            x = stage_input(pl, name, stage, device)
            part(x)
            times = []
            for _ in range(reps):
                _sync(device)
                t0 = time.perf_counter()
                part(x)
                _sync(device)
                times.append(time.perf_counter() - t0)
            out[name] = statistics.median(times)
    return out


def _connect(router: str, hello: dict) -> socket.socket:
    host, port = router.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=60)
    s.settimeout(None)
    s.sendall((json.dumps(hello) + "\n").encode())
    return s


def serve(
    pl: Placement,
    me: Place,
    parts: dict[str, Decoder],
    predicted: dict[str, float],
    router: str,
    device: torch.device = CPU,
) -> list[dict]:
    """Run this rank's shard of its stage until the group stops; (request id, model, seconds of this
    stage's service) each."""
    g = pl.groups[me.group]
    names = list(g.models)
    specs = {m.name: m for m in pl.models}
    first, last = me.stage == 0, me.stage == g.pp - 1
    lead_rank = me.rank(0, 0)
    prev_rank = me.rank(me.stage - 1, me.tp_index) if not first else -1
    next_rank = me.rank(me.stage + 1, me.tp_index) if not last else -1
    is_lead = first and me.tp_index == 0
    peers = [me.rank(0, t) for t in range(1, me.tp)] if is_lead else []
    lead = _connect(router, {"group": me.group, "role": "lead"}) if is_lead else None
    done = _connect(router, {"group": me.group, "role": "done"}) if last and me.tp_index == 0 else None
    lines = lead.makefile("r") if lead is not None else None
    header = torch.zeros(4, dtype=torch.long)
    log: list[dict] = []
    clock = time.monotonic() - time.perf_counter()  # perf_counter → monotonic (the router's clock)
    with torch.no_grad():
        while True:
            if is_lead:
                assert lines is not None and lead is not None
                line = lines.readline()
                t_begin = time.perf_counter()
                msg = json.loads(line) if line else {"stop": True}
                if msg.get("stop"):
                    header[:] = torch.tensor([STOP, 0, 0, 0])
                    for r in peers:
                        dist.send(header, r)
                    if not last:
                        dist.send(header, next_rank)
                    break
                rid, name = int(msg["id"]), msg["model"]
                if time.monotonic() + predicted[name] > float(msg["deadline"]):
                    lead.sendall((json.dumps({"id": rid, "status": "dropped"}) + "\n").encode())
                    continue
                sm = specs[name]
                m = names.index(name)
                tokens = torch.tensor(msg.get("tokens") or [0] * sm.tokens, dtype=torch.long)
                header[:] = torch.tensor([RUN, m, rid, tokens.numel()])
                for r in peers:  # the lead's tp peers run the same request in step with it
                    dist.send(header, r)
                    dist.send(tokens, r)
                x = tokens.reshape(1, -1).expand(sm.batch, -1).contiguous().to(device)
            elif first:  # a tp peer of the lead: header and tokens from it
                dist.recv(header, lead_rank)
                t_begin = time.perf_counter()
                if int(header[0]) == STOP:
                    if not last:
                        dist.send(header, next_rank)
                    break
                m, rid, n = int(header[1]), int(header[2]), int(header[3])
                name = names[m]
                sm = specs[name]
                tokens = torch.empty(n, dtype=torch.long)
                dist.recv(tokens, lead_rank)
                x = tokens.reshape(1, -1).expand(sm.batch, -1).contiguous().to(device)
            else:
                dist.recv(header, prev_rank)
                t_begin = time.perf_counter()
                if int(header[0]) == STOP:
                    if not last:
                        dist.send(header, next_rank)
                    break
                m, rid, n = int(header[1]), int(header[2]), int(header[3])
                name = names[m]
                sm = specs[name]
                x = torch.empty(sm.batch, n, sm.spec.hidden, device=device)
                dist.recv(x, prev_rank)
            t_fwd = time.perf_counter()
            y = parts[name](x)
            _sync(device)  # a GPU forward is asynchronous: its time ends when it is done
            t_send = time.perf_counter()
            if last:
                if done is not None:
                    token = int(y[0, -1].argmax())
                    done.sendall((json.dumps({"id": rid, "status": "ok", "token": token}) + "\n").encode())
            else:
                header[:] = torch.tensor([RUN, m, rid, y.shape[1]])
                dist.send(header, next_rank)
                dist.send(y.contiguous(), next_rank)
            _sync(device)
            # service time: what this stage spent on the request, from taking it to handing it on; and
            # when (monotonic, the router's clock) it took the request, had its input (after the
            # activation's recv), finished the forward and had handed it on: the simulator's per-request
            # samples of stage work, hop and front-end time (planner/serve/calibrate.py)
            t_out = time.perf_counter()
            stamps = {"t_in": t_begin, "t_fwd": t_fwd, "t_send": t_send, "t_out": t_out}
            log.append(
                {"id": rid, "model": name, "compute_s": t_out - t_begin, **{k: v + clock for k, v in stamps.items()}}
            )
    for s in (lead, done):
        if s is not None:
            s.close()
    return log


def main() -> None:
    args = _args()
    torch.set_num_threads(1)
    pl = Placement.model_validate_json(Path(args.placement).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=args.timeout_s)
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    me = my_place(pl, rank)
    device = device_of(pl, me.group)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mesh = tp_meshes(pl, me)
    parts = build(pl, me.group, me.stage, args.seed, mesh, device)
    dist.barrier()
    mine = calibrate(pl, parts, me.stage, args.calib_reps, device)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = me.tp_index == 0  # one file per stage: its tp ranks time the same collective forward
    if record:
        (out / f"calib_rank{rank}.json").write_text(json.dumps({"group": me.group, "stage": me.stage, "stage_s": mine}))
    # the lead predicts a request's latency from every stage's calibrated time (tp rank 0's each)
    gathered: list[dict | None] = [None] * world
    dist.all_gather_object(gathered, {"group": me.group, "stage": me.stage, "tp_index": me.tp_index, "stage_s": mine})
    predicted: dict[str, float] = {}
    for item in gathered:
        if item is not None and item["group"] == me.group and item["tp_index"] == 0:
            for name, t in item["stage_s"].items():
                predicted[name] = predicted.get(name, 0.0) + t
    log = serve(pl, me, parts, predicted, args.router, device)
    if record:
        (out / f"stage_rank{rank}.json").write_text(json.dumps({"group": me.group, "stage": me.stage, "requests": log}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
