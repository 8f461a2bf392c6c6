"""Build one layer at its local tensor-parallel shape and measure its time and memory.

Used by `worker.profile_layers` (the subprocess entry point). What is measured and how:

- **time**: forward and backward separately, per iteration, summed over a block of `inner`
  iterations (sized so a block lasts at least `min_block_s`), reported as the median over `repeats`
  blocks after warm-up, with the inter-quartile range of the blocks as the spread. CPU uses
  `perf_counter` (one thread: torch's intra-op threads would time each other); CUDA records events around each phase and
  synchronises once per block, so kernel-launch queues are not drained between phases.
  Parameter gradients accumulate across iterations, as under gradient accumulation.
- **tensor-parallel blocks are timed as the runtime runs them**: worker.parallel.apply_tp's DTensor
  Colwise/Rowwise block (`build_runtime_tp_case`). Where this node has tp devices (CPU: tp ≤ cores)
  the profiler runs as tp real ranks under torchrun and the block is timed on the real tp group, so
  the time includes its all-reduces and each one's wait for the slower rank (measured on 2 CPU
  ranks: 25–47 ms per fwd+bwd of the fidelity model's block at mbs 2, against 22 ms on a fake group
  plus 4 fitted all-reduces of 0.5 ms); such rows are flagged `tp_comm_included` and the cost model
  adds no all-reduces of its own. Otherwise it runs on a "fake" process group of tp ranks inside this
  one process, whose collectives return at once: the local-shape math plus everything DTensor adds
  around it (dispatch, redistributes, copies), with the all-reduces priced by the cost model from
  the measured gloo/NCCL fits.
- **parameter bytes**: exact, `numel · element_size` over the layer's local parameters.
- **activation bytes**: the unique storages autograd saves for backward during one forward
  (`saved_tensors_hooks`), excluding parameters. The layer's input *is* counted when autograd saves
  it (LayerNorm keeps its input): each block then owns the hidden state entering it, so a stage's
  activation memory is the plain sum over its layers, and under recompute (`checkpoint`,
  use_reentrant=False) a block keeps exactly its input, which is what the analytic model assumes.
- **workspace bytes** (extra memory at the layer's peak beyond params, grads and saved activations):
  CUDA: `max_memory_allocated` over one fwd+bwd minus the bytes allocated before it and minus the
  activations. CPU has no allocator statistics, so it is derived from two measured quantities:
  during backward the op that produced the largest forward tensor Y from X has grad_Y and grad_X
  alive at once (each at most |Y|), hence 2·max|Y|; with recompute the whole unchecked saved set is
  rebuilt during backward on top of that.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import checkpoint

from planner.measure.calibrate import OPTIMIZER_LAYOUTS
from planner.specs.model import ModelSpec
from worker.model import Block, Embedding, Head, loss_fn

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Request:
    """One measurement: a layer kind at a micro-batch size, sequence length, tp degree and recompute flag."""

    layer_kind: str
    micro_batch_size: int
    seq_len: int
    tp: int
    recompute: bool

    def as_key(self) -> tuple[str, int, int, int, bool]:
        return (self.layer_kind, self.micro_batch_size, self.seq_len, self.tp, self.recompute)


@dataclass
class LayerCase:
    """A built layer and closures running one forward (returning what backward needs) and one backward."""

    module: nn.Module
    forward: Callable[[], torch.Tensor]
    backward: Callable[[torch.Tensor], None]


def build_case(spec: ModelSpec, req: Request, device: str, dtype: str, seed: int = 0) -> LayerCase:
    """The layer of `req` on one of `req.tp` ranks, with random inputs of the micro-batch shape.

    Blocks and the head come from worker.model at their local shapes. The embedding is vocab-parallel
    under tp (Megatron): its token table is replaced by the local 1/tp slice; positions stay whole.
    The head's forward includes the cross-entropy loss over its local vocabulary slice (the
    all-reduces of vocab-parallel cross-entropy are communication, priced separately).
    """
    torch.manual_seed(seed)
    dt = TORCH_DTYPES[dtype]
    b, s, t, h = req.micro_batch_size, req.seq_len, req.tp, spec.hidden
    if req.layer_kind == "block":
        module = Block(spec, tp=t)
    elif req.layer_kind == "head":
        module = Head(spec, tp=t)
    elif req.layer_kind == "embedding":
        module = Embedding(spec)
        if t > 1:
            module.tok = nn.Embedding(spec.padded_vocab // t, h)
    else:
        raise ValueError(f"unknown layer kind {req.layer_kind!r}")
    module = module.to(device=device, dtype=dt)

    if req.layer_kind == "embedding":
        tokens = torch.randint(0, spec.padded_vocab // t, (b, s), device=device)
        grad = torch.randn(b, s, h, device=device, dtype=dt)
        return LayerCase(module, lambda: module(tokens), lambda out: out.backward(grad))

    x = torch.randn(b, s, h, device=device, dtype=dt, requires_grad=True)
    if req.layer_kind == "head":
        targets = torch.randint(0, spec.padded_vocab // t, (b, s), device=device)
        return LayerCase(module, lambda: loss_fn(module(x), targets), lambda loss: loss.backward())

    grad = torch.randn(b, s, h, device=device, dtype=dt)
    if req.recompute:
        return LayerCase(module, lambda: checkpoint(module, x, use_reentrant=False), lambda out: out.backward(grad))
    return LayerCase(module, lambda: module(x), lambda out: out.backward(grad))


FAKE_WORLD_SIZE = 64  # ranks of the fake default group; any tp up to this gets a sub-mesh of its own


def _fake_mesh(tp: int, device: str):  # noqa: ANN202 (DeviceMesh imported lazily with the fake backend)
    """A DeviceMesh of `tp` ranks on torch's in-process "fake" backend (created once per process)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    # torch's own test backend: the only way to run DTensor's real code path in one process
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=FAKE_WORLD_SIZE)
    return DeviceMesh(torch.device(device).type, list(range(tp)))


def build_runtime_tp_case(
    spec: ModelSpec, req: Request, device: str, dtype: str, seed: int = 0, mesh: Any = None
) -> LayerCase:
    """A block of `req` under DTensor tensor parallelism exactly as worker.parallel.apply_tp builds it,
    on `mesh` (a real group of req.tp ranks) or else a fake one (see the module docstring); used for
    timing only."""
    from worker.parallel import apply_tp

    if req.layer_kind != "block" or req.tp == 1:
        return build_case(spec, req, device, dtype, seed)
    if spec.num_heads % req.tp:  # the local-shape Block's own check and message (worker.model)
        raise ValueError(f"tp={req.tp} must divide num_heads={spec.num_heads}")
    torch.manual_seed(seed)
    dt = TORCH_DTYPES[dtype]
    module = Block(spec).to(device=device, dtype=dt)
    # apply_tp only walks `.blocks`: hand it this one block, so the styles stay defined in one place
    tp_mesh = mesh if mesh is not None else _fake_mesh(req.tp, device)
    apply_tp(SimpleNamespace(blocks={"0": module}), spec, tp_mesh)  # type: ignore[arg-type]
    b, s, h = req.micro_batch_size, req.seq_len, spec.hidden
    x = torch.randn(b, s, h, device=device, dtype=dt, requires_grad=True)
    grad = torch.randn(b, s, h, device=device, dtype=dt)
    fwd = (lambda: checkpoint(module, x, use_reentrant=False)) if req.recompute else (lambda: module(x))
    return LayerCase(module, fwd, lambda out: out.backward(grad))


def _quartile_spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def time_case(
    case: LayerCase,
    device: str,
    repeats: int,
    warmup: int,
    min_block_s: float,
    agree: Callable[[int], int] | None = None,
) -> dict[str, Any]:
    """Median forward/backward seconds per iteration over `repeats` blocks, with IQR spreads.

    `agree` makes the ranks of a real tp group run the same number of iterations per block (each
    one's collectives must meet the others'): it maps this rank's choice to the group's."""
    cuda = device.startswith("cuda")
    for _ in range(warmup):
        case.backward(case.forward())
    if cuda:
        torch.cuda.synchronize(device)

    def block(inner: int) -> tuple[float, float]:
        fwd_s = bwd_s = 0.0
        if cuda:
            events = []
            for _ in range(inner):
                e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                e0.record()
                out = case.forward()
                e1.record()
                case.backward(out)
                e2.record()
                events.append((e0, e1, e2))
            torch.cuda.synchronize(device)
            for e0, e1, e2 in events:
                fwd_s += e0.elapsed_time(e1) / 1e3
                bwd_s += e1.elapsed_time(e2) / 1e3
        else:
            for _ in range(inner):
                t0 = time.perf_counter()
                out = case.forward()
                t1 = time.perf_counter()
                case.backward(out)
                t2 = time.perf_counter()
                fwd_s += t1 - t0
                bwd_s += t2 - t1
        return fwd_s / inner, bwd_s / inner

    f1, b1 = block(1)  # sizes the blocks: one iteration's cost
    inner = max(1, math.ceil(min_block_s / max(f1 + b1, 1e-9)))
    if agree is not None:
        inner = agree(inner)
    fwd, bwd = [], []
    for _ in range(repeats):
        f, b = block(inner)
        fwd.append(f)
        bwd.append(b)
    return {
        "forward_s": statistics.median(fwd),
        "backward_s": statistics.median(bwd),
        "forward_spread_s": _quartile_spread(fwd),
        "backward_spread_s": _quartile_spread(bwd),
        "repeats": repeats,
        "inner_iters": inner,
    }


def param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def saved_activation_bytes(case: LayerCase) -> tuple[int, int]:
    """(bytes, count) of unique non-parameter storages autograd saves during one forward."""
    params = {p.untyped_storage().data_ptr() for p in case.module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = case.forward()
    del out
    return sum(seen.values()), len(seen)


class _LargestOutput(TorchDispatchMode):
    """Records the largest storage any op produces (the biggest transient a layer materialises)."""

    def __init__(self) -> None:
        super().__init__()
        self.max_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's protocol)
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.max_bytes = max(self.max_bytes, t.untyped_storage().nbytes())
        return out


def largest_forward_tensor_bytes(case: LayerCase) -> int:
    mode = _LargestOutput()
    with mode:
        out = case.forward()
    del out
    return mode.max_bytes


def cuda_workspace_bytes(case: LayerCase, device: str, activation_bytes: int) -> int:
    """Peak allocated over one fwd+bwd beyond what was allocated before it, less the kept activations."""
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    case.backward(case.forward())
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - base - activation_bytes)


def measure_memory(spec: ModelSpec, req: Request, device: str, dtype: str) -> dict[str, Any]:
    """Parameter, activation and workspace bytes of `req` (see the module docstring for definitions)."""
    case = build_case(spec, req, device, dtype)
    act, num_saved = saved_activation_bytes(case)
    out: dict[str, Any] = {
        "param_bytes": param_bytes(case.module),
        "activation_bytes": act,
        "num_saved_tensors": num_saved,
    }
    if device.startswith("cuda"):
        case.backward(case.forward())  # grads exist before the measured pass, as in steady-state training
        out["workspace_bytes"] = cuda_workspace_bytes(case, device, act)
        out["workspace_method"] = "cuda:max_memory_allocated"
        return out
    plain = build_case(spec, Request(req.layer_kind, req.micro_batch_size, req.seq_len, req.tp, False), device, dtype)
    transient = 2 * largest_forward_tensor_bytes(plain)
    rebuilt = saved_activation_bytes(plain)[0] if req.recompute and req.layer_kind == "block" else 0
    out["workspace_bytes"] = transient + rebuilt
    out["workspace_method"] = "cpu:2*largest_tensor+recomputed_saved_set"
    return out


def adamw_s_per_param(
    spec: ModelSpec, steps: int = 10, rounds: int = 3, layout: str = "plain", mesh: Any = None
) -> float:
    """Seconds per (local) parameter of one torch AdamW step (worker.options.make_optimizer's settings)
    over a block of `spec` on this process's CPU thread, the median of `rounds` × `steps` steps (the
    typical step, as the layer timings keep their median round), on random gradients of a training
    step's scale (zeros take another, slower path). A real block, because the time per parameter depends on the tensor
    sizes: the per-tensor states of a small model stay in cache.

    `layout`: "plain" parameters; "tp", the block tensor-parallel (apply_tp), or "fsdp", sharded by
    FSDP2's fully_shard: DTensors, where each of the optimizer's per-tensor ops dispatches through
    DTensor (several times the plain step for the fidelity model's small tensors). `mesh`: a real
    group of ranks that all run this at once, each step after a barrier, as training's ranks step
    together (the figure then holds their contention and lockstep: on 2 gloo ranks the FSDP2 step
    ran 30–38 ns/param, the same one rank alone on the fake group 18); None: a fake group of 2 in
    this process (worker.layer_bench._fake_mesh)."""
    import torch.distributed as dist

    if layout not in OPTIMIZER_LAYOUTS:
        raise ValueError(f"optimizer layout {layout!r} is not one of {OPTIMIZER_LAYOUTS}")
    block = Block(spec)
    if layout != "plain":
        dt_mesh = mesh if mesh is not None else _fake_mesh(2, "cpu")
        if layout == "tp":
            from worker.parallel import apply_tp

            apply_tp(SimpleNamespace(blocks={"0": block}), spec, dt_mesh)  # type: ignore[arg-type]
        else:
            from torch.distributed.fsdp import fully_shard

            fully_shard(block, mesh=dt_mesh)
    params = list(block.parameters())
    gen = torch.Generator().manual_seed(0)
    for p in params:
        # gradients of a training step's scale, not zeros: on zero gradients (m = v = 0) the same
        # step runs ~2x slower per parameter (measured 16.9 vs 7.0 ns, torch 2.13 CPU), and this
        # overpriced every plan's optimizer step ~2x against the runs (bench/fidelity.py)
        local = p.to_local() if hasattr(p, "to_local") else p
        g = torch.randn(local.shape, generator=gen, dtype=local.dtype) * 1e-3
        p.grad = type(p).from_local(g, p.device_mesh, p.placements) if hasattr(p, "to_local") else g
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    opt.step()  # allocates the states
    times = []
    for _ in range(rounds * steps):
        if mesh is not None:
            dist.barrier()
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params)
    return statistics.median(times) / local
