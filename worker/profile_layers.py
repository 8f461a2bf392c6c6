"""Layer profiler subprocess: measure each requested layer shape and append one JSON line per result.

    python -m worker.profile_layers --spec-json '{"name": "tiny", ...}' --out rows.jsonl \
        --layers block,head --mbs 1,2 --seq 64 --tp 1,2 --recompute 0,1

(a `ProfilerSpec`, planner/measure/ops.py: RunSpec's argv codec; flags `--print-device true` etc.)

or `--requests-json FILE` with a list of {layer_kind, micro_batch_size, seq_len, tp, recompute}.
Each line is written and flushed as soon as it is measured, so a crash or OOM loses nothing already
measured; when the out file already holds some requests (a retried run), those are skipped. The
embedding and the head have no recompute variant (full recompute checkpoints blocks), so one
measurement answers both flags. `--print-device true` prints the local device kind and torch version.
`--optimizer true` (with `--spec-json`, CPU only) prints torch AdamW's step time per parameter over one
block of the model, for plain, tensor-parallel and FSDP2-sharded parameters
(worker.layer_bench.adamw_s_per_param), as one JSON line, and writes nothing; with `--tp-group real`
every rank of the torchrun group steps at once on it, and rank 0 prints the ranks' median.
Timings are load-guarded: each shape is timed in `--rounds` round-robin passes and the median pass
is kept (see `typical`). The flow (not this process) writes the rows into DuckDB.

`--tp-group real`: this process is one of tp ranks started by torchrun (`python -m launcher.launch
--nproc-per-node TP -m worker.profile_layers … --tp-group real`); tensor-parallel blocks are timed
on that real group, collectives included (worker.layer_bench), and rank 0 writes the rows.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import platform
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from planner.errors import MeshplanError, UnknownNameError
from planner.measure.calibrate import OPTIMIZER_LAYOUTS
from planner.measure.ops import ProfilerSpec
from planner.measure.targets import catalog_peak
from planner.specs import flops
from planner.specs.catalog import lookup
from planner.specs.model import ModelSpec
from worker.inject import crash_once
from worker.layer_bench import (
    Request,
    adamw_s_per_param,
    build_case,
    build_runtime_tp_case,
    measure_memory,
    time_case,
)


def local_device() -> tuple[str, str]:
    """(torch device, device kind): the first CUDA GPU by its catalog name, else the CPU."""
    if not torch.cuda.is_available():
        return "cpu", "cpu"
    raw = torch.cuda.get_device_name(0)
    try:
        return "cuda:0", lookup(raw).name
    except UnknownNameError:
        return "cuda:0", raw  # unknown to the catalog: still measurable, just never estimated from peaks


def default_dtype(device: str) -> str:
    if not device.startswith("cuda"):
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def read_done(out: Path) -> set[tuple[str, int, int, int, bool]]:
    """Requests already in `out`; a torn last line (the writer died mid-line) is cut off first."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut != len(data):
        with out.open("r+b") as f:
            f.truncate(cut)
    done = set()
    for line in data[:cut].decode().splitlines():
        if line.strip():
            r = json.loads(line)
            done.add((r["layer_kind"], r["micro_batch_size"], r["seq_len"], r["tp"], r["recompute"]))
    return done


@dataclass
class TpGroup:
    """The real tp group of a `--tp-group real` run: its mesh, this rank, and the device it runs on."""

    mesh: Any
    rank: int
    device: str

    def agree(self, n: int) -> int:
        """The largest of the ranks' `n` (every rank then runs as many iterations)."""
        import torch.distributed as dist

        t = torch.tensor([n], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def share(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def join_tp_group(device: str) -> TpGroup:
    """Join the process group torchrun set up (gloo on CPU, NCCL on GPU: one GPU per rank)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if device.startswith("cuda"):
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    return TpGroup(mesh, dist.get_rank(), device)


def time_request(
    spec: ModelSpec, req: Request, device: str, dtype: str, args: ProfilerSpec, group: TpGroup | None = None
) -> dict[str, Any]:
    """One timing round of a layer shape (median of blocks, worker.layer_bench.time_case). A TP block
    is timed as the runtime's DTensor block (build_runtime_tp_case): on the real tp `group` when
    given, else on a fake group (on CPU; on GPU, where that path is not verified yet, at its local
    shapes)."""
    if group is not None:
        case = build_runtime_tp_case(spec, req, group.device, dtype, mesh=group.mesh)
        return time_case(case, group.device, args.repeats, args.warmup, args.min_block_s, agree=group.agree)
    build = build_runtime_tp_case if device == "cpu" else build_case
    case = build(spec, req, device, dtype)
    return time_case(case, device, args.repeats, args.warmup, args.min_block_s)


def typical(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median forward + backward (the lower middle one of an even count), whole
    (its spreads stay with it).

    Why not the fastest: the cost model predicts the step time a run will show, the median over its
    steps, on a machine as busy as it usually is. On a 2-core VM the same block's timing moves ±25 %
    from one minute to the next (measured), so the fastest of 3 rounds sat systematically below what
    training then measured (every plan of the fidelity bench under-predicted); the median round does
    not, and it still drops one burst that hits a single round."""
    ranked = sorted(rounds, key=lambda t: t["forward_s"] + t["backward_s"])
    return ranked[(len(ranked) - 1) // 2]


def measure(
    spec: ModelSpec, req: Request, device: str, dtype: str, args: ProfilerSpec, timing: dict[str, Any]
) -> dict[str, Any]:
    """One layer shape: its (median-round) timings, bytes, and achieved FLOP/s."""
    memory = measure_memory(spec, req, device, dtype)
    b, s, t = req.micro_batch_size, req.seq_len, req.tp
    train_flop = flops.training_flops(req.layer_kind, spec, b, s, t, req.recompute)  # type: ignore[arg-type]
    train_s = timing["forward_s"] + timing["backward_s"]
    return {
        **timing,
        **memory,
        "timing_rounds": args.rounds,
        "train_flop": train_flop,
        "achieved_flop_per_s": train_flop / train_s if train_s > 0 else 0.0,
    }


def requests_from_args(args: ProfilerSpec, spec: ModelSpec) -> list[Request]:
    if args.requests_json:
        text = Path(args.requests_json).read_text() if Path(args.requests_json).is_file() else args.requests_json
        return [Request(**r) for r in json.loads(text)]
    seqs = args.seq or [spec.seq_len]
    combos = itertools.product(args.layers, args.mbs, seqs, args.tp, [bool(r) for r in args.recompute])
    return [Request(k, b, s, t, r) for k, b, s, t, r in combos]


def run(args: ProfilerSpec) -> int:
    """Measure every request not yet in the out file; returns how many rows were written."""
    spec_text = Path(args.spec_json[1:]).read_text() if args.spec_json.startswith("@") else args.spec_json
    spec = ModelSpec.model_validate_json(spec_text)
    device, kind = local_device() if args.device == "auto" else (args.device, args.device_kind or args.device)
    kind = args.device_kind or kind
    dtype = args.dtype or default_dtype(device)
    if not device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    group = join_tp_group(device) if args.tp_group == "real" else None
    lead = group is None or group.rank == 0  # the one process that writes rows
    if group is not None:
        device = group.device
        world = group.mesh.size()
        wrong = sorted({r.tp for r in requests_from_args(args, spec)} - {world})
        if wrong:
            raise SystemExit(
                f"--tp-group real: requests with tp {wrong} in a group of {world} ranks; "
                f"launch one run per tp with --nproc-per-node equal to it"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    todo = [r for r in requests_from_args(args, spec) if r.as_key() not in read_done(out)] if lead else []
    if group is not None:
        todo = group.share(todo)  # every rank must time the same shapes in the same order
    # Embedding and head rows differ only in the recompute flag: measure each shape once.
    groups: dict[tuple, list[Request]] = {}
    for r in todo:
        shape = (r.layer_kind, r.micro_batch_size, r.seq_len, r.tp, r.recompute if r.layer_kind == "block" else None)
        groups.setdefault(shape, []).append(r)
    common = {
        "model_fingerprint": spec.fingerprint(),
        "model_name": spec.name,
        "device_kind": kind,
        "dtype": dtype,
        "torch_version": torch.__version__,
        "num_threads": torch.get_num_threads() if device == "cpu" else None,
        "host": platform.node(),
        "timing_method": "cuda:events" if device.startswith("cuda") else "cpu:perf_counter",
    }
    if group is not None:
        common["timing_method"] += f"; tp blocks on a real group of {group.mesh.size()} ranks"
    peak = catalog_peak(kind, dtype)
    progress = _progress(len(groups)) if args.progress and lead else None
    written = 0
    # Load guard: every shape is timed in `rounds` round-robin passes, so a slow phase of the shared
    # machine hits one round of many shapes rather than every round of one shape; the median round
    # is kept (see `typical`). Rows are written in the last pass, each as soon as it is complete; a
    # shape failing in an earlier pass is skipped there and fails for real in the last one, after
    # the rows before it were written.
    timings: dict[tuple, list[dict[str, Any]]] = {shape: [] for shape in groups}
    for _ in range(args.rounds - 1):
        for shape, reqs in groups.items():
            try:
                timings[shape].append(time_request(spec, reqs[0], device, dtype, args, group))
            except (RuntimeError, ValueError):
                continue
    with open(out if lead else os.devnull, "a") as f:
        for shape, reqs in groups.items():
            first = reqs[0]
            if progress:
                progress[0].update(
                    progress[1],
                    description=f"{kind} {first.layer_kind} mbs={first.micro_batch_size} "
                    f"seq={first.seq_len} tp={first.tp}",
                )
            timings[shape].append(time_request(spec, first, device, dtype, args, group))
            if not lead:
                continue
            result = measure(spec, first, device, dtype, args, typical(timings[shape]))
            for r in reqs:
                row = {
                    **common,
                    "layer_kind": r.layer_kind,
                    "micro_batch_size": r.micro_batch_size,
                    "seq_len": r.seq_len,
                    "tp": r.tp,
                    "recompute": r.recompute,
                    **result,
                    "estimated": False,
                    "tp_comm_included": group is not None and r.layer_kind == "block" and r.tp > 1,
                    "efficiency": result["achieved_flop_per_s"] / peak if peak else None,
                    "efficiency_source": "achieved / catalog peak" if peak else None,
                    "measured_at": dt.datetime.now(dt.UTC).isoformat(),
                }
                f.write(json.dumps(row) + "\n")
                written += 1
            f.flush()
            os.fsync(f.fileno())
            if progress:
                progress[0].advance(progress[1])
    if progress:
        progress[0].stop()
    if group is not None:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return written


def measure_optimizer(args: ProfilerSpec) -> dict[str, Any]:
    """AdamW's step time per local parameter over one block of the model, per parameter layout
    (planner.measure.calibrate.OPTIMIZER_LAYOUTS), on one CPU thread (load-guarded inside
    adamw_s_per_param): in this process on a fake group, or with `--tp-group real` on every rank of
    the torchrun group at once, as training's ranks step (the median over ranks; "num_ranks" says which)."""
    import torch.distributed as dist

    if args.device not in ("auto", "cpu"):
        raise SystemExit(f"--optimizer measures on the CPU only, not on {args.device}")
    spec_text = Path(args.spec_json[1:]).read_text() if args.spec_json.startswith("@") else args.spec_json
    spec = ModelSpec.model_validate_json(spec_text)
    torch.set_num_threads(1)
    group = join_tp_group("cpu") if args.tp_group == "real" else None
    out: dict[str, Any] = {
        layout: adamw_s_per_param(spec, layout=layout, mesh=group.mesh if group else None)
        for layout in OPTIMIZER_LAYOUTS
    }
    num_ranks = 1
    if group is not None:
        num_ranks = dist.get_world_size()
        every: list[Any] = [None] * num_ranks
        dist.all_gather_object(every, out)
        out = {layout: statistics.median(o[layout] for o in every) for layout in OPTIMIZER_LAYOUTS}
        dist.barrier()  # without it gloo sporadically aborts at exit
        dist.destroy_process_group()
    return {**out, "num_ranks": num_ranks, "torch_version": torch.__version__, "device_kind": "cpu"}


def _progress(total: int):  # noqa: ANN202 (rich types stay out of the signature: rich is imported lazily)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    p = Progress(
        TextColumn("profiling {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )
    p.start()
    return p, p.add_task("", total=total)


def parse_args(argv: list[str] | None = None) -> ProfilerSpec:
    """What the profiler is told (`ProfilerSpec`, planner/measure/ops.py): a bad flag is one line, exit 2."""
    try:
        return ProfilerSpec.from_argv(sys.argv[1:] if argv is None else argv)
    except MeshplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.print_device:
        device, kind = local_device()
        count = torch.cuda.device_count() if device.startswith("cuda") else len(os.sched_getaffinity(0))
        print(
            json.dumps(
                {
                    "device": device,
                    "device_kind": kind,
                    "dtype": default_dtype(device),
                    "torch_version": torch.__version__,
                    "device_count": count,
                }
            )
        )
        return
    if args.optimizer:
        out = measure_optimizer(args)
        if int(os.environ.get("RANK", "0")) == 0:  # one line, however many ranks measured
            print(json.dumps(out))
            sys.stdout.flush()
        return
    crash_once("profile")
    n = run(args)
    print(json.dumps({"rows_written": n, "out": str(args.out)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
    from worker.teardown import exit_now

    exit_now(0)  # no interpreter teardown after the process group is gone (worker/teardown.py)
