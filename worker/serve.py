"""A serving rank: one tp shard of one pipeline stage of every model its group hosts, forward passes only.

`python -m worker.agent --nproc-per-node N -m worker.serve <ServeSpec flags>`: one torchrun per
placement group (launcher/serving.py starts it, and starts it again when one of its ranks dies); the
ranks parse their `ServeSpec` (planner/specs/servespec.py) and nothing else. Within a group ranks are
numbered stage by stage, tp index by tp index; file names use the global rank (the group's
`base_rank` + its rank: groups in the placement's order).

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
group's pipeline; every rank then ends through worker/teardown.exit_now (barrier, destroy the
process group, os._exit), as every rank entry point does.

The lead checks a request's tokens again before anything is sent to a peer (the router checked them
against the model already): one it cannot run is answered `error` with one line, and the group goes
on. A group of one rank answers `error` for a forward that raises, too; in a group of several ranks
such an exception ends the rank (its peers would wait in a collective for ever), the router fails the
requests in flight on the group and launcher/serving.py starts the group again.

Devices: gloo on CPU. Where CUDA is present and a group's device kind is not "cpu", its ranks run
on cuda:LOCAL_RANK with NCCL for the activations and tp collectives (headers and tokens stay on
gloo, "cpu:gloo,cuda:nccl").
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import rundir
from planner.errors import MeshplanError
from planner.serve.cost import stage_layers
from planner.serve.placement import Placement
from planner.specs.servespec import ServeSpec
from worker.model import Decoder, init_weights
from worker.parallel import apply_tp
from worker.teardown import exit_now

RUN, STOP = 1, 0
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Place:
    """Where a rank sits: its group, stage, tp index, and the group's first rank in this process group."""

    group: int
    stage: int
    tp_index: int
    base: int
    pp: int
    tp: int
    solo: bool = False  # the process group is this group's ranks alone (one torchrun per group)

    def rank(self, stage: int, tp_index: int = 0) -> int:
        """The global rank of (stage, tp index) in this rank's group."""
        return self.base + stage * self.tp + tp_index

    @property
    def tp_ranks(self) -> list[int]:
        return [self.rank(self.stage, t) for t in range(self.tp)]


def my_place(pl: Placement, rank: int, group: int | None = None) -> Place:
    """Rank `rank` of a process group of every group (`group` None: ranks numbered over the whole
    placement), or of group `group`'s ranks alone (as launcher/serving.py starts them)."""
    if group is not None:
        g = pl.groups[group]
        if not 0 <= rank < g.pp * g.tp:
            raise SystemExit(f"rank {rank} has no place in group {group} of {g.pp * g.tp} ranks")
        stage, t = divmod(rank, g.tp)
        return Place(group, stage, t, 0, g.pp, g.tp, solo=True)
    base = 0
    for gi, g in enumerate(pl.groups):
        if rank < base + g.pp * g.tp:
            stage, t = divmod(rank - base, g.tp)
            return Place(gi, stage, t, base, g.pp, g.tp)
        base += g.pp * g.tp
    raise SystemExit(f"rank {rank} has no group: the placement has {base} devices")


def device_of(pl: Placement, gi: int, base_rank: int = 0) -> torch.device:
    """cuda:(base_rank + LOCAL_RANK) for a GPU group where CUDA is present (the placement's ranks in
    order over this machine's GPUs), else the CPU."""
    if pl.groups[gi].kind != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", base_rank + int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def tp_meshes(pl: Placement, me: Place) -> DeviceMesh | None:
    """This rank's stage tp mesh (None at tp = 1); collective: every rank builds every stage's mesh
    of tp > 1, in the placement's order (process groups are created by all ranks together)."""
    mine, base = None, 0
    for gi, g in enumerate(pl.groups):
        if me.solo and gi != me.group:
            continue  # the process group holds this group's ranks only
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


def _connect(router: tuple[str, int], hello: dict) -> socket.socket:
    s = socket.create_connection(router, timeout=60)
    s.settimeout(None)
    s.sendall((json.dumps(hello) + "\n").encode())
    return s


def serve(
    pl: Placement,
    me: Place,
    parts: dict[str, Decoder],
    predicted: dict[str, float],
    router: tuple[str, int],
    device: torch.device = CPU,
    generation: int = 0,
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
    hello = {"group": me.group, "generation": generation}
    lead = _connect(router, {**hello, "role": "lead"}) if is_lead else None
    done = _connect(router, {**hello, "role": "done"}) if last and me.tp_index == 0 else None
    alone = me.pp == 1 and me.tp == 1  # a forward that raises fails only its request
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
                problem = request_problem(msg.get("tokens"), sm.spec.seq_len, sm.spec.vocab_size)
                if problem:  # before any peer hears of it: the group goes on
                    lead.sendall((json.dumps({"id": rid, "status": "error", "error": problem}) + "\n").encode())
                    continue
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
            if alone:
                try:
                    y = parts[name](x)
                    _sync(device)
                except Exception as exc:  # noqa: BLE001 - one request fails, the group serves on
                    reply = {"id": rid, "status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
                    assert done is not None
                    done.sendall((json.dumps(reply) + "\n").encode())
                    continue
            else:
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


def request_problem(tokens, seq_len: int, vocab: int) -> str | None:
    """Why the lead cannot run these tokens (None: it can; None tokens: the model's default input)."""
    if tokens is None:
        return None
    if not isinstance(tokens, list) or not 0 < len(tokens) <= seq_len:
        return f"tokens must be a list of 1..{seq_len} ints"
    if not all(type(t) is int and 0 <= t < vocab for t in tokens):
        return f"tokens must be ints in 0..{vocab - 1}"
    return None


def main(argv: list[str] | None = None) -> None:
    try:
        spec = ServeSpec.from_argv(sys.argv[1:] if argv is None else argv)
    except MeshplanError as exc:
        print(f"worker.serve: {exc}", file=sys.stderr, flush=True)
        exit_now(2)
    torch.set_num_threads(1)
    pl = Placement.model_validate_json(Path(spec.placement).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=spec.timeout_s))
    me = my_place(pl, rank, spec.group)
    device = device_of(pl, me.group, spec.base_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mesh = tp_meshes(pl, me)
    parts = build(pl, me.group, me.stage, spec.seed, mesh, device)
    dist.barrier()
    mine = calibrate(pl, parts, me.stage, spec.calib_reps, device)
    name = spec.base_rank + rank  # the global rank names the files
    record = me.tp_index == 0  # one file per stage: its tp ranks time the same collective forward
    if record:
        path = rundir.serve_calib_path(spec.run_dir, name)
        path.write_text(json.dumps({"group": me.group, "stage": me.stage, "stage_s": mine}))
    # the lead predicts a request's latency from every stage's calibrated time (tp rank 0's each)
    gathered: list[dict | None] = [None] * world
    dist.all_gather_object(gathered, {"group": me.group, "stage": me.stage, "tp_index": me.tp_index, "stage_s": mine})
    predicted: dict[str, float] = {}
    for item in gathered:
        if item is not None and item["group"] == me.group and item["tp_index"] == 0:
            for model, t in item["stage_s"].items():
                predicted[model] = predicted.get(model, 0.0) + t
    log = serve(pl, me, parts, predicted, spec.router_address, device, spec.generation)
    if record:
        path = rundir.serve_stage_log_path(spec.run_dir, name)
        path.write_text(json.dumps({"group": me.group, "stage": me.stage, "requests": log}))
    exit_now(0)  # barrier, destroy the process group, no interpreter teardown (worker/teardown.py)


if __name__ == "__main__":
    main()
