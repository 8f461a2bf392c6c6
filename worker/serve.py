"""A serving rank: one pipeline stage of every model its group hosts, forward passes only.

`python -m worker.agent --nproc-per-node N -m worker.serve --placement P --router HOST:PORT --out-dir D`
(tasks/serve.py starts it). Ranks are numbered group by group, stage by stage, in the placement's
order. After building its stages each rank times its stage of every hosted model (all ranks at once,
so the contention of the serving run is in the figure) and writes `calib_rank<R>.json`: the
simulator's calibrated per-stage times. Then, per group, the first stage connects to the router
(the flow process's request front end) and reads requests, one JSON line each; it drops a request
whose predicted finish passes its deadline, else embeds it, runs its blocks and sends a header
(op, model, request id, tokens) and the activation to the next stage; the last stage runs the head
and reports the request done on its own router connection. Each rank also logs every request's
service seconds, from taking it to handing it on (`stage_rank<R>.json`), the service times the simulator is calibrated with after a
replay (the start-up figure is timed with every rank busy at once). Stages work on different requests at
once: pipelined execution, FCFS. A stop line ends the group's pipeline; every rank then meets the
others at a barrier before the process group is destroyed (gloo's exit abort, STACK.md §1.3).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from planner.serve.cost import stage_layers
from planner.serve.placement import Placement
from worker.model import Decoder, init_weights

RUN, STOP = 1, 0


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--placement", required=True)
    ap.add_argument("--router", required=True, help="HOST:PORT of the request front end")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--calib-reps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    return ap.parse_args()


def my_place(pl: Placement, rank: int) -> tuple[int, int, int]:
    """(group, stage, first rank of the group) of a rank."""
    base = 0
    for gi, g in enumerate(pl.groups):
        if rank < base + g.pp * g.tp:
            return gi, (rank - base) // g.tp, base
        base += g.pp * g.tp
    raise SystemExit(f"rank {rank} has no group: the placement has {base} devices")


def build(pl: Placement, gi: int, stage: int, seed: int) -> dict[str, Decoder]:
    g = pl.groups[gi]
    specs = {m.name: m for m in pl.models}
    out = {}
    for name in g.models:
        spec = specs[name].spec
        a, b = stage_layers(spec.num_layers, g.pp)[stage]
        part = Decoder(spec, (a, b), first=stage == 0, last=stage == g.pp - 1)
        init_weights(part, seed, spec.num_layers)
        out[name] = part.eval()
    return out


def stage_input(pl: Placement, name: str, stage: int) -> torch.Tensor:
    sm = next(m for m in pl.models if m.name == name)
    if stage == 0:
        return torch.zeros(sm.batch, sm.tokens, dtype=torch.long)
    return torch.zeros(sm.batch, sm.tokens, sm.spec.hidden)


def calibrate(pl: Placement, parts: dict[str, Decoder], stage: int, reps: int) -> dict[str, float]:
    """Median seconds of this stage's forward per hosted model (after one warm-up)."""
    out = {}
    with torch.no_grad():
        for name, part in parts.items():
            x = stage_input(pl, name, stage)
            part(x)
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                part(x)
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
    pl: Placement, gi: int, stage: int, base: int, parts: dict[str, Decoder], predicted: dict[str, float], router: str
) -> list[dict]:
    """Run this rank's stage until the group stops; (request id, model, seconds of this stage's forward) each."""
    g = pl.groups[gi]
    names = list(g.models)
    specs = {m.name: m for m in pl.models}
    first, last = stage == 0, stage == g.pp - 1
    prev_rank, next_rank = base + stage - 1, base + stage + 1
    lead = _connect(router, {"group": gi, "role": "lead"}) if first else None
    done = _connect(router, {"group": gi, "role": "done"}) if last else None
    lines = lead.makefile("r") if lead is not None else None
    header = torch.zeros(4, dtype=torch.long)
    log: list[dict] = []
    clock = time.monotonic() - time.perf_counter()  # perf_counter → monotonic (the router's clock)
    with torch.no_grad():
        while True:
            if first:
                assert lines is not None and lead is not None
                line = lines.readline()
                t_begin = time.perf_counter()
                msg = json.loads(line) if line else {"stop": True}
                if msg.get("stop"):
                    header[:] = torch.tensor([STOP, 0, 0, 0])
                    if not last:
                        dist.send(header, next_rank)
                    break
                rid, name = int(msg["id"]), msg["model"]
                if time.monotonic() + predicted[name] > float(msg["deadline"]):
                    lead.sendall((json.dumps({"id": rid, "status": "dropped"}) + "\n").encode())
                    continue
                sm = specs[name]
                tokens = msg.get("tokens") or [0] * sm.tokens
                x = torch.tensor(tokens, dtype=torch.long).reshape(1, -1).expand(sm.batch, -1).contiguous()
                m = names.index(name)
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
                x = torch.empty(sm.batch, n, sm.spec.hidden)
                dist.recv(x, prev_rank)
            t_fwd = time.perf_counter()
            y = parts[name](x)
            t_send = time.perf_counter()
            if last:
                assert done is not None
                done.sendall((json.dumps({"id": rid, "status": "ok", "token": int(y[0, -1].argmax())}) + "\n").encode())
            else:
                header[:] = torch.tensor([RUN, m, rid, y.shape[1]])
                dist.send(header, next_rank)
                dist.send(y.contiguous(), next_rank)
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
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    gi, stage, base = my_place(pl, rank)
    if pl.groups[gi].tp != 1:
        raise SystemExit(f"group {gi} has tp={pl.groups[gi].tp}: the CPU serving runtime runs pipeline groups (tp=1)")
    parts = build(pl, gi, stage, args.seed)
    dist.barrier()
    mine = calibrate(pl, parts, stage, args.calib_reps)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"calib_rank{rank}.json").write_text(json.dumps({"group": gi, "stage": stage, "stage_s": mine}))
    # the first stage predicts a request's latency from every stage's calibrated time
    gathered: list[dict | None] = [None] * world
    dist.all_gather_object(gathered, {"group": gi, "stage": stage, "stage_s": mine})
    predicted: dict[str, float] = {}
    for item in gathered:
        if item is not None and item["group"] == gi:
            for name, t in item["stage_s"].items():
                predicted[name] = predicted.get(name, 0.0) + t
    log = serve(pl, gi, stage, base, parts, predicted, args.router)
    (out / f"stage_rank{rank}.json").write_text(json.dumps({"group": gi, "stage": stage, "requests": log}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
