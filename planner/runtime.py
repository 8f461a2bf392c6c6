"""What meshplan's torch runtime can launch, and where each rank sits: the one statement of both.

The worker (`worker/train.py`), `estimate`, re-planning and the search all ask this module; no other
module restates a launch rule.

Rank map. A plan's device id is the identity of a physical device in the cluster; a global rank is
only where torchrun puts a process. The map is derived from the plan alone, deterministically:
ranks are numbered stage-major, then replica, then tp index, over the physical stages
(`stages[:pp]`), so rank `r` runs device `rank_map(plan)[r].device_id`. Consequences:
- any device order and any subset of the cluster's devices launches (world size = devices used);
- every stage's ranks are contiguous and increase along its replicas and tp shards, which is the
  order process groups give their members (ascending global rank), so DeviceMesh coordinates,
  DTensor shards and pipeline peers agree with the plan's coordinates;
- under the interleaved schedule, virtual stage i runs on the ranks of stage i mod pp.

Stages may differ in tp (and dp): each stage is then its own [dp_s, tp_s] mesh over its contiguous
ranks, and the worker runs the explicit schedule of worker/stages.py. Pipeline replica p (batch
share p, see `Plan`) holds replicas p·q_s … (p+1)·q_s − 1 of stage s, q_s = dp_s / plan.dp; each
of them runs every micro-batch of pipeline p as one of q_s equal slices (`RankSlot.slice_index`).
Activations cross a stage boundary between the tp-rank-0 leaders of the replicas whose sample
ranges overlap (`boundary_pieces`), and each leader broadcasts to its tp group.

Context parallelism (`StagePlan.cp`): ranks go stage-major, replica, cp index, tp index (device ids
are listed that way, `StagePlan.tp_devices`), so a uniform plan's mesh is [pp, dp, cp, tp]. cp rank c
runs chunks c and 2·cp − 1 − c of each sequence (`cp_positions`); its pipeline peers are the ranks
of the same (replica, cp, tp) coordinates, and gradients sum over dp × cp.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import MeshplanError
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan


@dataclass(frozen=True, slots=True)
class LaunchProblem:
    """One reason the runtime refuses a plan, in MeshplanError's terms (field, value, fix)."""

    field: str
    value: object
    fix: str

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.fix}"

    def error(self) -> MeshplanError:
        return MeshplanError(self.field, self.value, self.fix)


@dataclass(frozen=True, slots=True)
class RankSlot:
    """Where one global rank sits in the plan."""

    rank: int
    device_id: int
    stage: int  # physical stage (pipeline rank), 0..pp-1
    replica: int  # replica index inside its stage, 0..stage dp-1
    tp_index: int  # see cp_index for the cp coordinate
    tp: int  # the stage's tp
    dp: int  # the stage's dp
    virtual_stages: tuple[int, ...]  # indices into plan.stages this rank runs, in pipeline order
    pipeline: int  # the pipeline replica (index into batch_shares) this rank's replica belongs to
    slice_index: int  # which of its stage's num_slices equal slices of each micro-batch it runs
    num_slices: int  # q_s = stage dp / plan.dp (1 when every stage has the plan's dp)
    cp_index: int = 0  # which cp rank of its replica (chunks cp_index and 2·cp − 1 − cp_index)
    cp: int = 1


def rank_map(plan: Plan) -> tuple[RankSlot, ...]:
    """Rank r's slot is element r (stage-major, replica, tp; see the module docstring)."""
    slots: list[RankSlot] = []
    pp, nst = plan.pp, len(plan.stages)
    for i, s in enumerate(plan.stages[:pp]):
        virtual = tuple(range(i, nst, pp))
        q = num_slices(plan, i)
        for idx, dev in enumerate(s.device_ids):  # device_ids are replica-major, then cp: (r*cp + c)*tp + t
            r, c = idx // (s.tp * s.cp), idx // s.tp % s.cp
            slots.append(RankSlot(len(slots), dev, i, r, idx % s.tp, s.tp, s.dp, virtual, r // q, r % q, q, c, s.cp))
    return tuple(slots)


def num_slices(plan: Plan, stage: int) -> int:
    """q_s: how many of stage `stage`'s replicas share each micro-batch of one pipeline replica."""
    return plan.stages[stage].dp // plan.dp


def pipeline_replicas(plan: Plan, stage: int, pipeline: int) -> range:
    """Replicas of stage `stage` (indices into its dp) that serve pipeline replica `pipeline`."""
    q = num_slices(plan, stage)
    return range(pipeline * q, (pipeline + 1) * q)


def slice_size(plan: Plan, stage: int) -> int:
    """Samples one replica of `stage` runs per micro-batch (micro_batch_size / q_s)."""
    return plan.micro_batch_size // num_slices(plan, stage)


def loss_weight(plan: Plan) -> float:
    """Weight of one last-stage slice loss (a token mean over its samples): slice / global batch,
    so that the SUM over every slice of every micro-batch and replica is the full-batch mean; under
    context parallelism each cp rank's loss is the mean over its seq / cp tokens, so 1/cp of that."""
    return slice_size(plan, len(plan.stages) - 1) / plan.global_batch_size / plan.cp


@dataclass(frozen=True, slots=True)
class Piece:
    """Samples [start, stop) of a micro-batch of pipeline replica `pipeline` that cross a stage
    boundary from rank `src` (a tp leader of the earlier stage) to rank `dst` (of the later one).
    Offsets count from the start of the pipeline's micro-batch."""

    pipeline: int
    src: int
    dst: int
    start: int
    stop: int


def boundary_pieces(plan: Plan, stage: int) -> tuple[Piece, ...]:
    """What crosses the boundary between physical stages `stage` and `stage + 1` per micro-batch:
    the overlap of every source slice [u·b_s, (u+1)·b_s) with every destination slice
    [w·b_n, (w+1)·b_n), between the two replicas' tp-rank-0 leaders (equal dp: replica r → r)."""
    qs, qn = num_slices(plan, stage), num_slices(plan, stage + 1)
    bs, bn = slice_size(plan, stage), slice_size(plan, stage + 1)
    src_ranks, dst_ranks = stage_ranks(plan, stage), stage_ranks(plan, stage + 1)
    out = []
    for p in range(plan.dp):
        for u in range(qs):
            for w in range(qn):
                lo, hi = max(u * bs, w * bn), min((u + 1) * bs, (w + 1) * bn)
                if lo < hi:
                    out.append(Piece(p, src_ranks[p * qs + u][0], dst_ranks[p * qn + w][0], lo, hi))
    return tuple(out)


def cp_positions(seq_len: int, cp: int, cp_index: int) -> list[int]:
    """The sequence positions cp rank `cp_index` runs: chunks c and 2·cp − 1 − c of 2·cp equal chunks
    (load-balanced causal attention: every rank gets the same share of the causal s×s work)."""
    if cp == 1:
        return list(range(seq_len))
    w = seq_len // (2 * cp)
    lo, hi = cp_index * w, (2 * cp - 1 - cp_index) * w
    return list(range(lo, lo + w)) + list(range(hi, hi + w))


def device_to_rank(plan: Plan) -> dict[int, int]:
    return {slot.device_id: slot.rank for slot in rank_map(plan)}


def node_ranks(plan: Plan, node_of_device: dict[int, int], per_node: int) -> dict[int, int]:
    """Which torchrun node_rank each of the plan's nodes launches as, when its devices span nodes.

    torchrun's static rendezvous numbers global ranks node-major (node_rank × per_node + local
    rank), and rank r runs the device `rank_map(plan)[r]` names: so the ranks of each node's devices
    must be one aligned block of `per_node` ranks, the block's index that node's node_rank. Else a
    tp group or a stage the plan put inside a node would run across two: MeshplanError."""
    rank_of = device_to_rank(plan)
    members: dict[int, list[int]] = {}
    for device, rank in rank_of.items():
        members.setdefault(node_of_device[device], []).append(rank)
    out: dict[int, int] = {}
    for node, ranks in sorted(members.items()):
        block = ranks[0] // per_node
        if len(ranks) != per_node or any(r // per_node != block for r in ranks):
            raise MeshplanError(
                f"plan {plan.fingerprint()[:8]} node {node}",
                sorted(ranks),
                f"its devices run ranks that are not one block of {per_node} (torchrun numbers ranks "
                "node-major); launch it on one node, or a plan whose stages and replicas fill whole nodes",
            )
        out[node] = block
    return out


def stage_ranks(plan: Plan, stage: int) -> list[list[int]]:
    """Ranks of physical stage `stage` as [replica][tp index] (cp = 1; see stage_ranks_cp)."""
    first = sum(len(s.device_ids) for s in plan.stages[:stage])
    s = plan.stages[stage]
    return [[first + r * s.tp + t for t in range(s.tp)] for r in range(s.dp)]


def stage_ranks_cp(plan: Plan, stage: int) -> list[list[list[int]]]:
    """Ranks of physical stage `stage` as [replica][cp index][tp index]."""
    first = sum(len(s.device_ids) for s in plan.stages[:stage])
    s = plan.stages[stage]
    return [[[first + (r * s.cp + c) * s.tp + t for t in range(s.tp)] for c in range(s.cp)] for r in range(s.dp)]


def rank_plan(plan: Plan) -> Plan:
    """`plan` with each device id replaced by its rank (the layout the runtime builds)."""
    m = device_to_rank(plan)
    stages = tuple(s.model_copy(update={"device_ids": tuple(m[d] for d in s.device_ids)}) for s in plan.stages)
    return plan.model_copy(update={"stages": stages})


def is_uniform(plan: Plan) -> bool:
    """Every stage has the same tp and dp: one regular [pp, dp, tp] DeviceMesh holds the plan, and
    torch.distributed.pipelining's schedules run it; otherwise worker/stages.py's explicit one."""
    return len({(s.tp, s.dp) for s in plan.stages}) == 1


def launch_problems(
    plan: Plan, world_size: int | None = None, model: ModelSpec | None = None
) -> tuple[LaunchProblem, ...]:
    """Every reason the torch runtime cannot launch `plan` (on `world_size` ranks, for `model`);
    empty when it can. Each rule says why it exists."""
    out: list[LaunchProblem] = []
    if world_size is not None and plan.num_devices != world_size:
        out.append(
            LaunchProblem(
                "nproc",
                world_size,
                f"the plan uses {plan.num_devices} devices; launch exactly that many ranks in total",
            )
        )
    if not is_uniform(plan) and plan.schedule == "interleaved-1f1b":
        # worker/stages.py, which runs stages of different widths, orders gpipe and 1f1b only
        out.append(
            LaunchProblem(
                "schedule",
                plan.schedule,
                "stages with different tp or dp run gpipe or 1f1b; use one of those, or one tp and dp for all",
            )
        )
    if plan.schedule != "gpipe" and plan.pp > 1 and is_uniform(plan):
        fewest = min(plan.num_microbatches(r) for r in range(plan.dp))
        # torch.distributed.pipelining's 1F1B / interleaved refuse this (worker/stages.py's 1F1B,
        # which runs non-uniform plans, shortens its warm-up instead)
        if fewest < plan.pp:
            out.append(
                LaunchProblem(
                    "batch_shares",
                    list(plan.batch_shares),
                    f"a replica has {fewest} micro-batches < pp={plan.pp}; {plan.schedule} needs at least pp "
                    "(raise the share, lower micro_batch_size, or use gpipe)",
                )
            )
    counts = {plan.num_microbatches(r) for r in range(plan.dp)}
    if len(counts) > 1 and any(s.sharding == "zero3" for s in plan.stages):
        # zero3 all-gathers parameters in every micro-batch's forward, so replicas with different
        # micro-batch counts would issue different numbers of collectives and deadlock.
        out.append(LaunchProblem("stages.sharding", "zero3", "unequal batch shares need sharding none/zero1/zero2"))
    # the runtime's block (worker/model.py) is SDPA attention, torch's cross entropy, no dropout;
    # other stacks' memory terms are priced (planner.cost.memory) for plans exported to them
    stack = {
        "attention": ("sdpa", plan.attention),
        "loss": ("torch", plan.loss),
        "dropout": (False, plan.dropout),
        "fp8": (False, plan.fp8),  # fp8 GEMMs need a GPU with fp8 tensor cores (torchao / TE)
    }
    for name, (runs, asked) in stack.items():
        if asked != runs:
            out.append(LaunchProblem(name, asked, f"the torch runtime runs {name}={runs!r}; export the plan instead"))
    if plan.cp > 1 and not is_uniform(plan):
        # worker/stages.py (stages of different widths) moves whole sequences between tp leaders
        out.append(
            LaunchProblem(
                "stages.cp",
                plan.cp,
                "the torch runtime runs context parallelism on plans whose stages share one tp and dp; "
                "make them equal, or export the plan",
            )
        )
    for i, s in enumerate(plan.stages):
        if s.sequence_parallel and s.tp > 1 and (plan.seq_len // s.cp) % s.tp:
            # worker.parallel.apply_tp shards the sequence dimension (a cp rank's seq / cp tokens) in
            # equal slices over tp
            local = f"seq_len / cp = {plan.seq_len // s.cp}" if s.cp > 1 else f"seq_len={plan.seq_len}"
            out.append(
                LaunchProblem(
                    f"stages[{i}].sequence_parallel",
                    True,
                    f"sequence parallelism splits {local} over tp={s.tp}; make tp divide it",
                )
            )
    if model is not None:
        for i, s in enumerate(plan.stages):
            # DTensor's Colwise split of wq/wk/wv must cut whole heads on every tp rank.
            if model.num_heads % s.tp or model.kv_heads % s.tp:
                out.append(
                    LaunchProblem(
                        f"stages[{i}].tp",
                        s.tp,
                        f"tp must divide heads={model.num_heads} and kv heads={model.kv_heads}",
                    )
                )
    return tuple(out)


def check_launchable(plan: Plan, world_size: int | None = None, model: ModelSpec | None = None) -> None:
    """Raise the first launch problem as a MeshplanError (the worker's and the CLI's edge)."""
    problems = launch_problems(plan, world_size, model)
    if problems:
        raise problems[0].error()


def launchable_first(plans: list[Plan], model: ModelSpec | None = None) -> list[Plan]:
    """`plans` (already ranked) with every launchable plan before every refused one, order kept
    otherwise. A refused plan keeps its reasons in `predicted.notes` (`estimate` writes them as
    `runtime: field=value: fix`), so it is marked, never silently ranked first."""
    ok = [p for p in plans if not launch_problems(p, model=model)]
    return ok + [p for p in plans if p not in ok]


def problem_notes(plan: Plan, model: ModelSpec | None = None) -> list[str]:
    return [f"runtime: {q}" for q in launch_problems(plan, model=model)]


DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def machine_problem(
    plan: Plan, model: ModelSpec, ranks_here: int, gpus_here: int, memory_available_bytes: int | None
) -> str | None:
    """Why this machine cannot run `ranks_here` of the plan's ranks, or None — checked before any rank
    starts, so a plan made for a bigger cluster is refused in one line instead of OOM-killed minutes in.

    With GPUs, each rank needs one of them. Memory is a lower bound: every parameter exists at least
    once, with its gradient, in the plan's dtype (optimizer state, activations and replicas only
    add); on a machine without GPUs the ranks hold it in host memory, and the plan's share of it that
    this machine's ranks hold must fit what is available."""
    if gpus_here and ranks_here > gpus_here:
        return f"it starts {ranks_here} ranks on this machine, which has {gpus_here} GPU(s)"
    if gpus_here or memory_available_bytes is None:
        return None
    need = model.num_params() * 2 * DTYPE_BYTES[plan.dtype] * ranks_here // plan.num_devices
    if need > memory_available_bytes:
        return (
            f"its {ranks_here} rank(s) here hold at least {need / 1e9:.1f} GB of {model.name}'s weights and "
            f"gradients ({model.num_params() / 1e9:.2f}e9 parameters in {plan.dtype}); this machine has "
            f"{memory_available_bytes / 1e9:.1f} GB available"
        )
    return None
