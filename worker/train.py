"""One torchrun rank of a plan: `torchrun --nproc-per-node K -m worker.train --plan plan.json ...`.

Each rank maps its global rank to (stage, replica, tp index) (worker/parallel.py), builds only its
stage(s) of the Decoder with the plan's layer split, applies TP → recompute → DP, and runs the
plan's schedule with torch.distributed.pipelining — also when pp == 1 (a one-stage pipeline), so
micro-batching and FSDP's gradient-sync handling follow one code path. A plan whose stages differ
in tp or dp gets a mesh per stage and worker/stages.py's explicit schedule instead, with the same
loss weighting and gradient sync.

Gradient weighting for unequal batch shares. Replica r runs M_r = share_r / mbs micro-batches. Each
micro-batch loss (token mean) is scaled by mbs / global_batch (by slice / global batch when the last
stage splits micro-batches over more replicas: planner.runtime.loss_weight), the schedule does not rescale
(`scale_grads=False`), and data parallelism SUMS gradients over replicas (GradSumSync's all-reduce
for sharding none; FSDP2 with divide factor 1 and SUM collectives for zero1/2/3). Summed over every micro-batch of every replica that is
Σ_r Σ_mb (mbs/G)·∇loss_mb = (1/G)·Σ_samples ∇loss_sample — the full-batch mean gradient, whatever the
shares. The logged loss is the replica's mean micro-batch loss (unscaled).

Re-planning while running (launcher/control.py): at every step boundary rank 0 reads
`<run>/control.json` and broadcasts it, so all ranks apply a new version at the same step — new
batch shares (the schedule is rebuilt for the new micro-batch counts; the mbs / global-batch loss
weight is unchanged, so the update stays exact), or checkpoint-and-exit for a relayout. Telemetry
rows carry the control version in force and, on the switch step, the action. Injected faults
(slow compute, slow sends, a crash: one `--faults` FaultSpec) come from worker/faults.py.

Init: gloo on CPU, NCCL on GPU (device LOCAL_RANK). The process group's store is the agent's store
under a per-restart prefix, so `--max-restarts` re-rendezvous does not read a dead attempt's keys,
and the run ends with a barrier before destroy_process_group (exit SIGABRT trap).
Hangs are bounded twice: gloo's collective timeout (--timeout-s), and a per-phase watchdog
(worker/watchdog.py) for what that timeout misses, such as a re-rendezvous stuck in init.
Resuming trusts only a checkpoint that passes its digests (worker/checkpoint_check.py).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.pipelining.schedules import _PipelineSchedule

import rundir
from launcher.control import exit_path, read_control, read_generation, write_json_atomic
from planner.errors import MeshplanError
from planner.runtime import check_launchable, cp_positions, is_uniform, loss_weight
from planner.specs.model import ModelSpec, get_model
from planner.specs.plan import Plan, check_plan_against, parse_plan, parse_plan_json
from worker import checkpoint, teardown, watchdog
from worker.clip import clip_grad_norm, global_grad_norm
from worker.cp import apply_cp
from worker.data import batch_rows, replica_rows
from worker.faults import Faults
from worker.hf_weights import load_into
from worker.model import loss_fn
from worker.options import RankArgs, make_optimizer, parse_args
from worker.parallel import (
    GradSumSync,
    RankLayout,
    apply_dp,
    apply_recompute,
    apply_tp,
    build_mesh,
    build_stage_part,
    grad_mesh,
    rank_layout,
)
from worker.stages import StagePipeline, build_stage_mesh
from worker.telemetry import ComputeTimer, StepLog, memory_bytes, sync_device

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_spec(opts: RankArgs, plan: Plan) -> ModelSpec:
    if opts.run.model_json is not None:
        return ModelSpec.model_validate_json(Path(opts.run.model_json).read_text())
    spec = get_model(opts.run.model or plan.model)
    if plan.seq_len > spec.seq_len:
        raise MeshplanError("plan.seq_len", plan.seq_len, f"the model's positions end at seq_len={spec.seq_len}")
    return spec


def resolve_resume(opts: RankArgs) -> Path | None:
    """Collective: the newest checkpoint that passes its integrity check (worker/checkpoint_check.py)."""
    return checkpoint.resume_from(opts.run.resume_mode, opts.run_dir)


def init_distributed(timeout_s: float) -> tuple[int, int, torch.device]:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=timeout_s)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        store=dist.PrefixStore(f"meshplan/attempt{restart}/", base),
        rank=rank,
        world_size=world,
        timeout=timeout,
    )
    return rank, world, device


def build_parts(
    opts: RankArgs, plan: Plan, spec: ModelSpec, layout: RankLayout, mesh: DeviceMesh, device: torch.device
) -> tuple[list[nn.Module], list[GradSumSync]]:
    """This rank's stage parts (one, or v under interleaving), each TP → recompute → DP wrapped."""
    parts, grad_syncs = [], []
    for vi in layout.virtual_stages:
        part = build_stage_part(spec, plan, vi, opts.run.seed, device)
        if opts.run.init:  # Hugging Face weights over the seeded init, before tp splits them
            load_into(part, spec, Path(opts.run.init.removeprefix("hf:")))
        sp = plan.stages[vi]
        if layout.tp > 1:
            apply_tp(part, spec, mesh["tp"], sp.sequence_parallel)
        if layout.cp > 1:
            apply_cp(part, mesh["cp"].get_group(), layout.cp, layout.cp_index, plan.seq_len, device)
        apply_recompute(part, sp.recompute, sp.recompute_every)
        wrapped, sync = apply_dp(part, plan.stages[vi], grad_mesh(mesh))
        parts.append(wrapped)
        grad_syncs += [sync] if sync is not None else []
    return parts, grad_syncs


def build_rank_mesh(plan: Plan, layout: RankLayout, device: torch.device) -> DeviceMesh:
    """The [pp, dp, tp] mesh of a uniform plan, or this rank's stage's [dp, tp] mesh (worker/stages.py)."""
    return build_mesh(plan, device.type) if is_uniform(plan) else build_stage_mesh(plan, device.type, layout.stage)


def build_schedule(
    plan: Plan,
    layout: RankLayout,
    parts: list[nn.Module],
    mesh: DeviceMesh,
    device: torch.device,
    timer: ComputeTimer,
    faults: Faults | None = None,
    spec: ModelSpec | None = None,
) -> _PipelineSchedule | StagePipeline:
    """The plan's schedule over this rank's stages; micro-batch losses weighted by mbs / global batch.

    Built again (with fresh PipelineStage objects over the same modules) when batch shares change,
    because a stage sizes its buffers for one micro-batch count."""
    if not is_uniform(plan):
        assert spec is not None and len(parts) == 1, "non-uniform plans have one stage per rank"
        return StagePipeline(
            plan, spec, layout.stage, layout.pipeline, layout.slice_index, parts[0], mesh, device, timer, faults
        )
    weight = loss_weight(plan)

    def weighted_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return loss_fn(logits, targets) * weight

    pp_group = mesh["pp"].get_group()
    stages = [
        PipelineStage(p, vi, len(plan.stages), device, group=pp_group)
        for p, vi in zip(parts, layout.virtual_stages, strict=True)
    ]
    for st in stages:
        if faults is not None:
            faults.instrument_stage(st)  # inside the timer: injected slowness counts as compute
        timer.instrument_stage(st)
    n_mb = plan.num_microbatches(layout.pipeline)
    if plan.schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, n_mb, loss_fn=weighted_loss, scale_grads=False)
    cls = ScheduleGPipe if plan.schedule == "gpipe" else Schedule1F1B
    return cls(stages[0], n_mb, loss_fn=weighted_loss, scale_grads=False)


def _static_fields(opts: RankArgs, plan: Plan, layout: RankLayout, attempt: int, load_s: float) -> dict:
    rows = replica_rows(plan.batch_shares, layout.pipeline)
    return {
        "run_id": opts.run_id,
        "rank": layout.rank,
        # torchrun's node of this rank (GROUP_RANK) and its place there: several nodes number ranks
        # node-major (planner/runtime.py node_ranks), which these let a run's telemetry show
        "node_rank": int(os.environ.get("GROUP_RANK", "0")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "stage": layout.stage,
        "replica": layout.replica,
        "tp_index": layout.tp_index,
        "pp": layout.pp,
        "dp": layout.dp,
        "tp": layout.tp,
        "attempt": attempt,
        "num_microbatches": plan.num_microbatches(layout.pipeline),
        "samples": len(rows) // layout.num_slices,
        "tokens": len(rows) // layout.num_slices * plan.seq_len // layout.cp,
        "plan_fingerprint": plan.fingerprint(),
        "checkpoint_load_s": load_s,
        "generation": opts.site.generation,
    }


def rebalanced(plan: Plan, shares: list[int], world: int) -> Plan | None:
    """`plan` with new batch shares, or None (on every rank alike) when they are not runnable."""
    try:
        new = parse_plan({**plan.model_dump(mode="json"), "batch_shares": list(shares)}, rundir.CONTROL)
        check_launchable(new, world)
    except MeshplanError as exc:
        print(f"control: ignoring batch_shares {shares}: {exc}", file=sys.stderr, flush=True)
        return None
    return new


def poll_control(opts: RankArgs, rank: int, step: int, applied: int) -> dict | None:
    """Rank 0 reads control.json; every rank gets the same new message (or None) at the same step,
    or raises Superseded at the same step once a newer generation of the run folder exists."""
    box: list = [None, 0]
    if rank == 0:
        msg = read_control(opts.run_dir)
        if msg is not None and msg["version"] > applied and step >= int(msg.get("at_step", 0)):
            box[0] = msg
        box[1] = read_generation(opts.run_dir)
    dist.broadcast_object_list(box, src=0)
    if opts.site.generation and box[1] > opts.site.generation:
        raise checkpoint.Superseded(opts.site.generation, box[1])
    return box[0]


def train(opts: RankArgs, plan: Plan, spec: ModelSpec, rank: int, device: torch.device) -> None:
    layout = rank_layout(plan, rank)
    world = dist.get_world_size()
    mesh = build_rank_mesh(plan, layout, device)
    parts, grad_syncs = build_parts(opts, plan, spec, layout, mesh, device)
    faults = Faults(opts.run.faults, rank)
    for sync in grad_syncs:
        sync.before_send = faults.delay_send
    optims = [make_optimizer(p.parameters(), opts.run.optimizer, opts.run.lr) for p in parts]
    ckpt = resolve_resume(opts)
    written_by = checkpoint.read_meta(ckpt).get("generation", 0) if ckpt is not None else 0
    if opts.site.generation and written_by > opts.site.generation:  # a newer launch saved: this one is stale
        raise checkpoint.Superseded(opts.site.generation, written_by)
    t_load = time.perf_counter()
    start = checkpoint.load(ckpt, parts, optims) if ckpt is not None else 0
    load_s = time.perf_counter() - t_load if ckpt is not None else 0.0
    timer = ComputeTimer(device)
    schedule = build_schedule(plan, layout, parts, mesh, device, timer, faults, spec)
    weight = loss_weight(plan)

    has_first, has_last = layout.has_first, layout.has_last(len(plan.stages))
    amp = AMP_DTYPES.get(plan.dtype if opts.run.dtype == "auto" and device.type == "cuda" else opts.run.dtype)
    autocast = torch.autocast(device.type, dtype=amp) if amp is not None else nullcontext()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log = StepLog(opts.run_dir, rank, _static_fields(opts, plan, layout, attempt, load_s))
    meta = {"plan_fingerprint": plan.fingerprint(), "model": spec.name, "world_size": world}
    meta |= {"generation": opts.site.generation} if opts.site.generation else {}
    version = opts.site.control_from_version
    for step in range(start, opts.run.steps):
        watchdog.beat(f"step {step}")
        faults.maybe_kill(step, attempt)
        faults.step = step
        msg = poll_control(opts, rank, step, version)
        switch = None
        if msg is not None:
            version = msg["version"]
            if msg["action"] == "checkpoint_exit":
                _checkpoint_exit(opts, rank, step, version, parts, optims, meta)
                break
            new = rebalanced(plan, msg.get("batch_shares", []), world)
            if new is not None:
                plan, switch = new, "rebalance"
                meta["plan_fingerprint"] = plan.fingerprint()
                schedule = build_schedule(plan, layout, parts, mesh, device, timer, faults, spec)
                log.update_static(_static_fields(opts, plan, layout, attempt, load_s))
        n_mb = plan.num_microbatches(layout.pipeline)
        rows = replica_rows(plan.batch_shares, layout.pipeline)
        x, y = batch_rows(
            opts.run.data, step, rows, plan.global_batch_size, plan.seq_len, spec.vocab_size, opts.run.seed
        )  # type: ignore[arg-type]
        if layout.cp > 1:  # this cp rank's tokens (worker/cp.py)
            pos = cp_positions(plan.seq_len, layout.cp, layout.cp_index)
            x, y = x[:, pos], y[:, pos]
        args = (x.to(device),) if has_first else ()
        kwargs = {"target": y.to(device), "losses": []} if has_last else {}
        timer.reset()
        t0 = time.perf_counter()
        with autocast:
            schedule.step(*args, **kwargs)
        for sync in grad_syncs:
            sync()
        # one all-reduce: the global gradient norm, and whether any rank's loss is not finite
        losses = [v.item() for v in kwargs["losses"]] if has_last else []
        logged = layout.replica == 0 and layout.tp_index == 0 and layout.cp_index == 0
        mine = sum(losses) / weight / n_mb if has_last and logged else 0.0
        bad = float(any(not math.isfinite(v) for v in losses))
        norm, bad, shown = global_grad_norm(parts, list(layout.virtual_stages), plan, device, (bad, mine))
        if bad or not math.isfinite(norm):
            _diverged(opts, step, shown, norm)  # every rank, the same verdict: no rank waits on another
        if opts.run.grad_clip_norm:
            clip_grad_norm(parts, list(layout.virtual_stages), plan, opts.run.grad_clip_norm, device, norm)
        sync_device(device)
        t1 = time.perf_counter()
        for o in optims:
            o.step()
            o.zero_grad(set_to_none=True)
        sync_device(device)
        t2 = time.perf_counter()
        compute_s, step_s = timer.reset(), t2 - t0
        loss = sum(losses) / weight / n_mb if has_last else None
        done = step + 1
        ckpt_s = None
        if done == opts.run.steps or (opts.run.checkpoint_every and done % opts.run.checkpoint_every == 0):
            t3 = time.perf_counter()
            checkpoint.save(opts.run_dir, done, parts, optims, meta)
            ckpt_s = time.perf_counter() - t3
        if opts.run.eval_every and (done % opts.run.eval_every == 0 or done == opts.run.steps):
            evaluate(opts, plan, spec, layout, schedule, parts, device, autocast, done)
        mem, mem_kind = memory_bytes(device)
        log.write(
            step=step,
            step_time_s=step_s,
            compute_s=compute_s,
            optimizer_s=t2 - t1,
            comm_wait_s=max(0.0, step_s - compute_s - (t2 - t1)),
            loss=loss,
            memory_bytes=mem,
            memory_kind=mem_kind,
            control_version=version,
            switch_action=switch,
            checkpoint_s=ckpt_s,
        )
        if has_last and layout.replica == 0 and layout.tp_index == 0:
            print(f"step {step} loss {loss:.4f} step_time {step_s * 1e3:.1f} ms", flush=True)
    log.close()


def evaluate(
    opts: RankArgs,
    plan: Plan,
    spec: ModelSpec,
    layout: RankLayout,
    schedule: _PipelineSchedule | StagePipeline,
    parts: list[nn.Module],
    device: torch.device,
    autocast: Any,
    done: int,
) -> float:
    """Collective: the mean loss over `eval_batches` global batches of the held-out split.

    It runs the training schedule itself (every layout meshplan launches, uneven and unequal ones
    included, has one) and discards the gradients: no optimizer step, no gradient sync. Each batch's
    micro-batch losses are weighted as in training (mbs / global batch, 1/cp more under context
    parallelism), so their sum over the ranks holding the loss (last stage, tp rank 0) is the batch's mean.
    """
    total = torch.zeros(1, dtype=torch.float64)
    for b in range(opts.run.eval_batches):
        rows = replica_rows(plan.batch_shares, layout.pipeline)
        x, y = batch_rows(opts.run.data, b, rows, plan.global_batch_size, plan.seq_len, spec.vocab_size, split="val")
        if layout.cp > 1:
            pos = cp_positions(plan.seq_len, layout.cp, layout.cp_index)
            x, y = x[:, pos], y[:, pos]
        has_last = layout.has_last(len(plan.stages))
        args = (x.to(device),) if layout.has_first else ()
        kwargs = {"target": y.to(device), "losses": []} if has_last else {}
        with autocast:
            schedule.step(*args, **kwargs)
        for p in parts:
            p.zero_grad(set_to_none=True)
        if has_last and layout.tp_index == 0:
            total += sum(float(v) for v in kwargs["losses"])
    dist.all_reduce(total)  # gloo and NCCL both sum float64 on the CPU tensor's device
    val = float(total) / opts.run.eval_batches
    if dist.get_rank() == 0:
        tokens = opts.run.eval_batches * plan.global_batch_size * plan.seq_len
        with rundir.eval_log(opts.run_dir).open("a") as f:
            f.write(
                json.dumps(
                    {
                        "step": done,
                        "val_loss": val,
                        "num_batches": opts.run.eval_batches,
                        "tokens": tokens,
                        "wall_time_s": time.time(),
                    }
                )
                + "\n"
            )
    if layout.has_last(len(plan.stages)) and layout.replica == 0 and layout.tp_index == 0:
        print(f"step {done} val_loss {val:.4f}", flush=True)
    return val


def _diverged(opts: RankArgs, step: int, loss: float, norm: float) -> None:
    """Stop the run: the loss or the gradient norm is not finite, so no later step can recover and a
    checkpoint of it would poison every resume. Recorded in resume.jsonl (rank 0) for the flow to
    report in one line and close the run `failed`; the latest checkpoint (before the divergence) stays."""
    exc = MeshplanError(
        "--lr",
        opts.run.lr,
        f"training diverged at step {step}: loss {loss:.4g}, gradient norm {norm:.4g}; lower --lr or set "
        "--grad-clip-norm (the run stopped before applying this step; earlier checkpoints are kept)",
    )
    checkpoint.record_refusal(opts.run_dir, exc)
    raise exc


def _checkpoint_exit(
    opts: RankArgs,
    rank: int,
    step: int,
    version: int,
    parts: list[nn.Module],
    optims: list[torch.optim.Optimizer],
    meta: dict,
) -> None:
    """Save the state after `step` completed steps and tell the flow (exit.json) this exit was asked for."""
    t0 = time.perf_counter()
    checkpoint.save(opts.run_dir, step, parts, optims, meta)
    if rank == 0:
        write_json_atomic(
            exit_path(opts.run_dir), {"step": step, "version": version, "checkpoint_s": time.perf_counter() - t0}
        )


def main(argv: list[str] | None = None) -> None:
    try:
        opts = parse_args(argv)
        plan_file = Path(opts.site.plan)
        plan = parse_plan_json(plan_file.read_text(), str(plan_file))
        spec = resolve_spec(opts, plan)
        check_plan_against(plan, spec.num_layers, 1 + max(d for s in plan.stages for d in s.device_ids))
        check_launchable(plan, int(os.environ.get("WORLD_SIZE", "1")), spec)
    except MeshplanError as exc:  # every rank sees the same mistake: one line, before any rendezvous
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    watchdog.start(opts.run.collective_timeout_s, f" rank {os.environ.get('RANK', '?')}").beat(
        "rendezvous"
    )  # bounds hangs
    rank, _, device = init_distributed(opts.run.collective_timeout_s)
    watchdog.beat("setup and resume")
    code = 0
    try:
        train(opts, plan, spec, rank, device)
    except checkpoint.Superseded as exc:  # every rank raises it at the same boundary (a broadcast verdict)
        print(f"rank {rank}: {exc}", file=sys.stderr, flush=True)
        code = SUPERSEDED_EXIT_CODE
    except MeshplanError as exc:  # e.g. every checkpoint unreadable: one line, not a traceback per rank
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)  # no barrier: a rank that refused may not be met by its peers; no teardown to abort
    watchdog.beat("final barrier")
    teardown.end_process_group()  # barrier first: without it gloo sporadically aborts at exit
    watchdog.stop()
    teardown.exit_now(code)


SUPERSEDED_EXIT_CODE = 4  # not 0: a runner that still watches must not count a fenced-off launch as finished


if __name__ == "__main__":
    main()
