"""Distributed hardware bench, run under torchrun: every rank probes itself, then all measure the network.

    python -m torch.distributed.run --nproc-per-node 2 -m worker.netbench --out snapshot.json

One code path: gloo on CPU (one thread per rank), NCCL on GPU (one GPU per rank). Measured per
message size (median of repeats, slowest rank for collectives): all_reduce, all_gather and
reduce_scatter over all ranks, send/recv ping-pong between rank pairs (and a trivial 2-stage 1F1B pipeline
step of torch.distributed.pipelining between ranks 0 and 1, `bench_pipeline`, and FSDP2's own cost per
sharded module and tensor, `bench_fsdp`; and how much slower ranks compute together than alone,
and in lockstep than free, `bench_concurrency`), each pair classed as
intra-node or inter-node by node name (MESHPLAN_NODE_NAME overrides the hostname, so two simulated
nodes on one machine are told apart). An op the backend lacks is recorded as unsupported, not faked.
Message bytes follow nccl-tests: the whole buffer (all_reduce buffer, all_gather output,
reduce_scatter input). Rank 0 gathers everything and writes one JSON snapshot; other ranks write nothing.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from planner.errors import MeshplanError
from planner.measure.ops import BenchOp, NetbenchSpec
from worker.probe import GPU_MIN_MATMUL, cuda_devices, host_info, median_time_s, nvlink_topology, probe_device
from worker.telemetry import resident_bytes, sync_device

SNAPSHOT_VERSION = 1
# Pairs to ping-pong: every pair on small worlds; beyond that rank 0 to each rank plus ring neighbours.
ALL_PAIRS_MAX_WORLD = 8


def _inner_iters(nbytes: int) -> int:
    """Ops per timed repeat: small messages take microseconds, so time a batch (same on every rank)."""
    return max(1, min(50, (1 << 20) // max(nbytes, 1)))


def _pairs(world: int) -> list[tuple[int, int]]:
    if world <= ALL_PAIRS_MAX_WORLD:
        return list(itertools.combinations(range(world), 2))
    pairs = {(0, j) for j in range(1, world)} | {(i, i + 1) for i in range(world - 1)}
    return sorted(pairs)


def _collectives(world: int) -> dict[BenchOp, Callable[[torch.Tensor], Callable[[], object]]]:
    """op name → (buffer → a call that runs it once). Newer torch renames the *_tensor variants."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def all_reduce(buf: torch.Tensor) -> Callable[[], object]:
        return lambda: dist.all_reduce(buf)

    def all_gather(buf: torch.Tensor) -> Callable[[], object]:
        shard = buf[: buf.numel() // world].clone()
        return lambda: gather(buf, shard)

    def reduce_scatter(buf: torch.Tensor) -> Callable[[], object]:
        shard = torch.empty(buf.numel() // world, dtype=buf.dtype, device=buf.device)
        return lambda: scatter(shard, buf)

    return {BenchOp.ALL_REDUCE: all_reduce, BenchOp.ALL_GATHER: all_gather, BenchOp.REDUCE_SCATTER: reduce_scatter}


def _buffer(nbytes: int, world: int, device: str) -> torch.Tensor:
    """A float32 buffer of about nbytes, divisible by the world size (collectives split it evenly)."""
    numel = max(world, (nbytes // 4) // world * world)
    return torch.ones(numel, dtype=torch.float32, device=device)


def bench_collectives(sizes: list[int], repeats: int, device: str) -> tuple[list[dict], list[dict]]:
    """(rows, unsupported) for every collective and size; each row holds this rank's median."""
    world = dist.get_world_size()
    rows, unsupported = [], []
    for op, make in _collectives(world).items():
        try:
            make(_buffer(sizes[0], world, device))()
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            # Backends reject an op they lack before any traffic, identically on every rank.
            unsupported.append({"op": op, "reason": str(exc).splitlines()[0][:300]})
            continue
        for nbytes in sizes:
            buf = _buffer(nbytes, world, device)
            dist.barrier()
            t = median_time_s(make(buf), device, repeats=repeats, inner=_inner_iters(nbytes))
            rows.append({"op": op, "message_bytes": buf.numel() * 4, "time_s": t, "num_ranks": world})
    return rows, unsupported


def bench_pairs(sizes: list[int], repeats: int, device: str) -> list[dict]:
    """Ping-pong send/recv between rank pairs, one pair at a time; one-way time = round trip / 2."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for a, b in _pairs(world):
        for nbytes in sizes:
            buf = _buffer(nbytes, 1, device)
            dist.barrier()
            if rank not in (a, b):
                continue
            peer, first = (b, True) if rank == a else (a, False)

            def ping_pong(buf: torch.Tensor = buf, peer: int = peer, first: bool = first) -> None:
                if first:
                    dist.send(buf, peer)
                    dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer)
                    dist.send(buf, peer)

            t = median_time_s(ping_pong, device, repeats=repeats, inner=_inner_iters(nbytes)) / 2
            if rank == a:
                rows.append(
                    {"op": BenchOp.SEND_RECV, "message_bytes": buf.numel() * 4, "time_s": t, "src": a, "dst": b}
                )
    dist.barrier()
    return rows


PIPE_HIDDEN, PIPE_MICROBATCHES = 256, 8


def bench_pipeline(repeats: int, device: str) -> list[dict]:
    """One 1F1B step of torch.distributed.pipelining over ranks 0 and 1 with trivial stages (a
    256-wide Linear on one token, so compute and bytes are negligible): what the runtime's schedule
    costs per micro-batch slot beyond the layers and the α–β of the p2p (the cost model's pipeline
    overhead, planner.measure.calibrate). Measured on 2 gloo CPU ranks: 4.5–6 ms per micro-batch, against a 0.2–0.6 ms
    send/recv round trip. Other ranks only join the barriers."""
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    rank = dist.get_rank()
    rows: list[dict] = []
    group = dist.new_group([0, 1])  # every rank takes part in creating it
    if rank < 2:
        m = PIPE_MICROBATCHES
        torch.manual_seed(0)
        stage = PipelineStage(
            nn.Linear(PIPE_HIDDEN, PIPE_HIDDEN).to(device), rank, 2, torch.device(device), group=group
        )
        sched = Schedule1F1B(stage, m, loss_fn=lambda y, t: (y - t).pow(2).mean())
        x = torch.randn(m, 1, PIPE_HIDDEN, device=device)
        target = torch.randn(m, 1, PIPE_HIDDEN, device=device)

        def step() -> None:
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=target, losses=[])

        step()  # warm-up: buffers and shapes
        t = median_time_s(step, device, repeats=repeats, inner=1)
        if rank == 0:  # per micro-batch: the cost model prices the step as m × (stage 0's τ) here
            rows.append(
                {
                    "op": BenchOp.PIPELINE_MICROBATCH,
                    "message_bytes": PIPE_HIDDEN * 4,
                    "time_s": t / m,
                    "src": 0,
                    "dst": 1,
                }
            )
    dist.barrier()
    return rows


FSDP_MODULES, FSDP_TENSORS = 4, 16
FSDP_WIDTHS = (64, 1024)  # one 64×64 tensor (16 KiB) and one 1024×1024 tensor (4 MiB) per module


def bench_fsdp(repeats: int, device: str) -> list[dict]:
    """FSDP2's own cost per sharded module, per byte and per parameter tensor, over ranks 0 and 1.

    One forward + backward of FSDP_MODULES modules, each T tensors of w×w computing x @ p on one
    row (compute negligible), each `fully_shard`-ed with reshard_after_forward=True (ZeRO-3: an
    all-gather before forward and one before backward, a reduce-scatter after), less the same step
    unsharded, per module: `fsdp_module` rows at T = 1 for both FSDP_WIDTHS (their message_bytes:
    the module's parameter bytes), and `fsdp_tensor`, what each further 64×64 tensor adds (T = 1 to
    FSDP_TENSORS). On CPU ranks most of it is Python and copies around each collective, beyond what
    the collectives' own fits price (planner.measure.calibrate.fsdp_overhead_from). Other ranks only join
    the barriers."""
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    class Chain(nn.Module):
        def __init__(self, tensors: int, width: int) -> None:
            super().__init__()
            self.ps = nn.ParameterList(nn.Parameter(torch.eye(width)) for _ in range(tensors))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for p in self.ps:
                x = x @ p
            return x

    rank = dist.get_rank()
    rows: list[dict] = []
    group = dist.new_group([0, 1])  # every rank takes part in creating it
    if rank < 2:
        mesh = DeviceMesh.from_group(group, torch.device(device).type)
        per_module = {}
        for tensors, width in ((1, FSDP_WIDTHS[0]), (1, FSDP_WIDTHS[1]), (FSDP_TENSORS, FSDP_WIDTHS[0])):
            x = torch.ones(1, width, device=device)
            times = []
            for shard in (False, True):
                model = nn.Sequential(*(Chain(tensors, width) for _ in range(FSDP_MODULES))).to(device)
                if shard:
                    for chain in model:
                        fully_shard(chain, mesh=mesh, reshard_after_forward=True)
                    fully_shard(model, mesh=mesh, reshard_after_forward=True)

                def step(model: nn.Module = model, x: torch.Tensor = x) -> None:
                    model(x).sum().backward()

                times.append(median_time_s(step, device, repeats=repeats, warmup=2, inner=1))
            per_module[tensors, width] = max(0.0, times[1] - times[0]) / FSDP_MODULES
        if rank == 0:
            for width in FSDP_WIDTHS:
                rows.append(
                    {"op": BenchOp.FSDP_MODULE, "message_bytes": width * width * 4, "time_s": per_module[1, width]}
                )
            small = FSDP_WIDTHS[0]
            extra = max(0.0, per_module[FSDP_TENSORS, small] - per_module[1, small]) / (FSDP_TENSORS - 1)
            rows.append({"op": BenchOp.FSDP_TENSOR, "message_bytes": small * small * 4, "time_s": extra})
            for row in rows:
                row.update(src=0, dst=1)
    dist.barrier()
    return rows


CONCURRENCY_ITERS = 10


def bench_concurrency(device: str, matmul_size: int, rounds: int) -> list[dict]:
    """How much slower ranks compute when they run at once than alone (contention: shared caches and
    memory bus), and when they also meet after every chunk of work, as training's ranks do at each
    p2p and collective, than running free (lockstep): the cost model's two slowdowns
    (planner.measure.calibrate.measured_slowdowns).

    On CPU the first k = min(world, this node's cores) ranks take part, one per core (more ranks than
    cores would time the cores' sharing, which the cost model prices itself); on GPUs every rank.
    Each round, in rotating order: rank 0 runs CONCURRENCY_ITERS matmuls of `matmul_size` (about a
    micro-batch's work on a CPU core; GPU_MIN_MATMUL at least on a GPU, as the probe) while the others
    wait; all k run them free; all k run them with a barrier after each; and all time
    CONCURRENCY_ITERS bare barriers. Rows (num_ranks = k), median over `rounds` of the per-chunk
    time: `compute_alone`; `compute_free` (each round the ranks' median); `compute_lockstep`, less
    the bare barrier's. Measured on this VM's 2 gloo CPU ranks: lockstep 1.05–1.27x free (a rank's
    speed drifts from moment to moment, and in lockstep every chunk takes the slowest rank's time,
    where running free each rank averages its own); free 0.97–1.07x alone."""
    world, rank = dist.get_world_size(), dist.get_rank()
    cores: list[Any] = [None] * world
    dist.all_gather_object(cores, host_info()["num_cores"] or world)  # every rank must agree on k
    k = world if device.startswith("cuda") else min(world, *cores)
    group = dist.new_group(list(range(k)))  # every rank takes part in creating it
    rows: list[dict] = []
    if rank < k:
        size = max(matmul_size, GPU_MIN_MATMUL) if device.startswith("cuda") else matmul_size
        a = torch.randn(size, size, device=device)
        b = torch.randn(size, size, device=device)
        out = torch.empty(size, size, device=device)
        for _ in range(2):
            torch.mm(a, b, out=out)
        dev = torch.device(device)

        def timed(mode: str) -> float:
            """Per-chunk seconds: `alone` (rank 0 works), `free`, `lockstep`, or `barrier` (no work)."""
            sync_device(dev)
            dist.barrier(group)
            start = time.perf_counter()
            if mode != "alone" or rank == 0:
                for _ in range(CONCURRENCY_ITERS):
                    if mode != "barrier":
                        torch.mm(a, b, out=out)
                    if mode in ("lockstep", "barrier"):
                        sync_device(dev)
                        dist.barrier(group)
            sync_device(dev)
            t = (time.perf_counter() - start) / CONCURRENCY_ITERS
            dist.barrier(group)  # the others wait while rank 0 works alone
            return t

        modes = ("alone", "free", "lockstep")
        times: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(rounds):
            for mode in modes[r % 3 :] + modes[: r % 3]:
                times[mode].append(timed(mode))
            times["lockstep"][-1] -= timed("barrier")
        every: list[Any] = [None] * k
        dist.all_gather_object(every, times["free"], group=group)
        if rank == 0:
            free = statistics.median(statistics.median(f[r] for f in every) for r in range(rounds))
            for op, t in (
                (BenchOp.COMPUTE_ALONE, statistics.median(times["alone"])),
                (BenchOp.COMPUTE_FREE, free),
                (BenchOp.COMPUTE_LOCKSTEP, max(0.0, statistics.median(times["lockstep"]))),
            ):
                rows.append({"op": op, "message_bytes": 0, "time_s": t, "num_ranks": k})
    dist.barrier()
    return rows


def _link_class(nodes: list[str]) -> str:
    return "intra-node" if len(set(nodes)) == 1 else "inter-node"


def assemble(per_rank: list[dict[str, Any]], backend: str, sizes: list[int]) -> dict[str, Any]:
    """The snapshot from every rank's report: ranks, nodes, and measurements with link classes."""
    node_of = {r["rank"]: r["node"] for r in per_rank}
    nodes: dict[str, dict[str, Any]] = {}
    for r in per_rank:
        nodes.setdefault(r["node"], {**r["host"], "gpus": r["gpus"], "nvlink": r["nvlink"], "ranks": []})
        nodes[r["node"]]["ranks"].append(r["rank"])
        if r.get("runtime_rss_bytes"):  # the node's largest rank
            node = nodes[r["node"]]
            node["runtime_rss_bytes"] = max(node.get("runtime_rss_bytes", 0), r["runtime_rss_bytes"])
    measurements = []
    for row in per_rank[0]["collectives"]:
        # A collective finishes when its slowest rank does.
        same = [
            c["time_s"]
            for r in per_rank
            for c in r["collectives"]
            if c["op"] == row["op"] and c["message_bytes"] == row["message_bytes"]
        ]
        measurements.append(
            {
                **row,
                "time_s": max(same),
                "src": None,
                "dst": None,
                "link_class": _link_class(list(node_of.values())),
            }
        )
    for r in per_rank:
        for row in r["pairs"]:
            link = _link_class([node_of[row["src"]], node_of[row["dst"]]])
            measurements.append({**row, "num_ranks": 2, "link_class": link})
    ranks = [{k: r[k] for k in ("rank", "local_rank", "node", "probe")} for r in per_rank]
    return {
        "version": SNAPSHOT_VERSION,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "backend": backend,
        "world_size": len(per_rank),
        "message_sizes": sizes,
        "nodes": nodes,
        "ranks": ranks,
        "measurements": measurements,
        "unsupported": per_rank[0]["unsupported"],
    }


def runtime_rss_bytes(device: str) -> int:
    """Resident bytes of a training rank before its plan allocates anything: this rank, its process
    group up, with the training runtime's modules imported (worker.train's: torch.distributed's
    pipelining, tensor and FSDP packages, ~90 MB beyond torch alone on CPU) and its kernels run once
    (two AdamW steps of the `tiny` preset: the library code pages a first forward, backward and
    optimizer step touch, ~13 MB, and the runtime's first-use buffers, ~7 MB on CPU; the preset's own
    tensors are a few hundred kB). Every training rank holds these on top of what its plan allocates;
    planner.cost.formulas.runtime_reserve_bytes is the datasheet stand-in where nothing was measured.
    On a GPU the CUDA context lives outside the resident set: 0 there (the datasheet reserve holds)."""
    if device != "cpu":
        return 0
    import worker.train  # noqa: F401  (imported for what it makes resident)
    from planner.specs.model import get_model
    from worker.model import Decoder, init_weights, loss_fn

    spec = get_model("tiny")
    model = Decoder(spec, layers=(0, spec.num_layers), first=True, last=True)
    init_weights(model, 0, spec.num_layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)  # worker.options.make_optimizer's
    for step in range(2):
        x = torch.randint(0, spec.vocab_size, (2, spec.seq_len), generator=torch.Generator().manual_seed(step))
        loss_fn(model(x), x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    del model, opt
    return resident_bytes()


def run(out: Path, sizes: list[int], repeats: int, matmul_size: int) -> None:
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = f"cuda:{local_rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(local_rank)
    else:
        torch.set_num_threads(1)  # one CPU rank = one process with one thread
    dist.init_process_group(backend, timeout=dt.timedelta(seconds=300))
    try:
        rank = dist.get_rank()
        dist.barrier()
        rss = runtime_rss_bytes(device)
        probe = probe_device(device, matmul_size, repeats)
        collectives, unsupported = bench_collectives(sizes, repeats, device)
        pairs = bench_pairs(sizes, repeats, device)
        if dist.get_world_size() >= 2:
            pairs += bench_pipeline(repeats, device)
            pairs += bench_fsdp(repeats, device)
            collectives += bench_concurrency(device, matmul_size, repeats)
        report = {
            "rank": rank,
            "local_rank": local_rank,
            "node": host_info()["node"],
            "host": host_info(),
            "gpus": cuda_devices() if cuda else [],
            "nvlink": nvlink_topology() if cuda and local_rank == 0 else None,
            "probe": probe,
            "runtime_rss_bytes": rss,
            "collectives": collectives,
            "unsupported": unsupported,
            "pairs": pairs,
        }
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, report)
        if rank == 0:
            snapshot = assemble(gathered, backend, sizes)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(out.suffix + ".tmp")
            tmp.write_text(json.dumps(snapshot, indent=1))
            tmp.replace(out)  # readers never see a half-written snapshot
    finally:
        dist.barrier()  # without it gloo sporadically aborts at exit
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """Parse what the rank is told (`NetbenchSpec`, planner/measure/ops.py; one line naming a bad
    flag) and run the bench."""
    try:
        a = NetbenchSpec.from_argv(sys.argv[1:] if argv is None else argv)
    except MeshplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    start = time.perf_counter()
    run(Path(a.out), sorted(a.message_sizes), a.repeats, a.matmul_size)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"netbench: wrote {a.out} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
    from worker.teardown import exit_now

    exit_now(0)  # no interpreter teardown after the process group is gone (worker/teardown.py)
