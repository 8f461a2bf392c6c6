"""The scheduler's vocabulary: jobs, allocations, the cluster's free and busy devices, decisions.

Pure data (frozen dataclasses) so a round's inputs and outputs can be logged, compared and replayed.
GPU kinds are short lower-case aliases ("a100", "v100", "a40", "a10"): the trace's names, and what
`kind_alias` makes of a catalog name, so one table and one cluster file speak the same language.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.errors import MeshplanError
from planner.specs.model import ModelSpec

POLICIES = ("srtf", "jct", "throughput", "deadline", "fairness", "fcfs", "gavel", "crius", "sia")
DEFAULT_POLICY = "srtf"  # what `schedule-cluster`, `simulate` and bench/scheduler.py run unless told


def kind_alias(device: str) -> str:
    """'A100-SXM4-40GB' → 'a100', 'A40' → 'a40': the GPU family a speed table is keyed by."""
    return device.split("-")[0].lower()


def known_kinds() -> list[str]:
    """Every kind a job may ask for: the catalog's GPU families, and `cpu` (a discovered CPU machine)."""
    from planner.specs.catalog import CATALOG

    return sorted({kind_alias(name) for name in CATALOG} | {"cpu"})


def parse_kinds(text: str, flag: str = "--gpu-kinds") -> tuple[str, ...]:
    """'A100, v100' → ('a100', 'v100'); a kind no cluster can have is refused now, naming `flag`,
    rather than queued as a job no round can ever start."""
    from planner.errors import closest

    kinds = tuple(k.strip().lower() for k in text.split(",") if k.strip())
    known = known_kinds()
    for k in kinds:
        if k not in known:
            near = closest(k, known)
            hint = f"did you mean {', '.join(near)}? " if near else ""
            raise MeshplanError(
                flag, k, f"no such GPU kind; {hint}kinds: {', '.join(known)} (`meshplan gpus` lists the GPUs)"
            )
    return kinds


@dataclass(frozen=True, slots=True)
class Allocation:
    """`count` GPUs of one kind on `num_nodes` nodes, `count // num_nodes` on each."""

    kind: str
    count: int
    num_nodes: int = 1

    def __post_init__(self) -> None:
        if self.count <= 0 or self.num_nodes <= 0 or self.count % self.num_nodes:
            raise MeshplanError(
                "allocation", f"{self.count}x{self.num_nodes}", "count must be a positive multiple of num_nodes"
            )

    @property
    def per_node(self) -> int:
        return self.count // self.num_nodes

    def __str__(self) -> str:
        return f"{self.count}×{self.kind} on {self.num_nodes} node{'s' if self.num_nodes > 1 else ''}"


def alloc_text(a: Allocation) -> str:
    """An allocation as the jobs table stores it: `4xcpu/1` is 4 cpu devices on 1 node."""
    return f"{a.count}x{a.kind}/{a.num_nodes}"


def parse_alloc(text: str) -> Allocation:
    """The allocation `alloc_text` wrote."""
    count_kind, nodes = text.split("/")
    count, kind = count_kind.split("x", 1)
    return Allocation(kind, int(count), int(nodes))


@dataclass(frozen=True, slots=True)
class Job:
    """One training job. `model` is a preset name or a table key ('bert_2.6B_256'); `iterations` the steps to run.

    `spec` is the model's dimensions when they are not a preset's (a custom or model-file job):
    the planner prices that, and `model` is then only its name (what a speed table is keyed by).

    `requested` is what the user asked for (FCFS runs exactly that); `kinds` restricts the GPU kinds
    any policy may give it (empty = any). `state_bytes` (weights + optimizer states) prices a switch.
    """

    job_id: str
    model: str
    global_batch: int
    iterations: int
    submit_s: float
    seq: int | None = None
    priority: int = 0
    deadline_s: float | None = None
    kinds: tuple[str, ...] = ()
    requested: Allocation | None = None
    state_bytes: float = 0.0
    spec: ModelSpec | None = None

    def allows(self, kind: str) -> bool:
        return not self.kinds or kind in self.kinds


@dataclass(frozen=True, slots=True)
class Placement:
    """An allocation pinned to nodes: node index → GPUs taken there."""

    alloc: Allocation
    nodes: tuple[tuple[int, int], ...]


@dataclass
class RunningJob:
    """A job holding devices: where, since when, how far it got, and the time still owed to a (re)start."""

    job: Job
    placement: Placement
    iter_time_s: float
    done_iterations: float = 0.0
    started_s: float = 0.0
    warmup_left_s: float = 0.0
    base: Allocation | None = None  # the most GPU-efficient allocation it was admitted with
    plan: str = ""

    @property
    def remaining_iterations(self) -> float:
        return max(0.0, self.job.iterations - self.done_iterations)

    def remaining_s(self) -> float:
        return self.warmup_left_s + self.remaining_iterations * self.iter_time_s


@dataclass
class ClusterState:
    """Devices by node: kind and total per node, and how many are busy now.

    `can_place` answers from a cache of "nodes of kind k with at least g free", cleared whenever
    devices are taken or released, so a round that asks about hundreds of jobs × dozens of
    allocations scans the nodes only once per change.
    """

    node_kind: list[str]
    node_total: list[int]
    node_busy: list[int] = field(default_factory=list)
    device_names: dict[str, str] = field(default_factory=dict)  # alias → catalog name (for the planner)

    def __post_init__(self) -> None:
        if not self.node_busy:
            self.node_busy = [0] * len(self.node_kind)
        if not (len(self.node_kind) == len(self.node_total) == len(self.node_busy)):
            raise MeshplanError(
                "cluster", len(self.node_kind), "node kinds, totals and busy counts must be equally long"
            )
        per_kind: dict[str, list[int]] = {}
        for k, t in zip(self.node_kind, self.node_total, strict=True):
            per_kind.setdefault(k, []).append(t)
        self._total = {k: sum(v) for k, v in per_kind.items()}
        self._max_per_node = {k: max(v) for k, v in per_kind.items()}
        self.shape = tuple(sorted((k, self._total[k], self._max_per_node[k]) for k in per_kind))
        self._nodes: dict[str, list[int]] = {}  # kind → its node indices: a query scans one kind's nodes
        for i, k in enumerate(self.node_kind):
            self._nodes.setdefault(k, []).append(i)
        self._avail: dict[tuple[str, int], int] = {}
        self._free_total: int | None = None

    @property
    def kinds(self) -> list[str]:
        return sorted(self._total)

    @property
    def num_devices(self) -> int:
        return sum(self._total.values())

    def total(self, kind: str) -> int:
        return self._total.get(kind, 0)

    def max_per_node(self, kind: str) -> int:
        return self._max_per_node.get(kind, 0)

    def free(self, kind: str) -> int:
        t, b = self.node_total, self.node_busy
        return sum(t[i] - b[i] for i in self._nodes.get(kind, ()))

    def busy(self, kind: str) -> int:
        return self.total(kind) - self.free(kind)

    def free_total(self) -> int:
        if self._free_total is None:
            self._free_total = sum(self.node_total) - sum(self.node_busy)
        return self._free_total

    def copy(self) -> ClusterState:
        return ClusterState(list(self.node_kind), list(self.node_total), list(self.node_busy), dict(self.device_names))

    def invalidate(self, kinds: set[str] | None = None) -> None:
        """Forget cached answers (about `kinds` only, when given): call after changing `node_busy`."""
        if kinds is None:
            self._avail.clear()
        else:
            for key in [key for key in self._avail if key[0] in kinds]:
                del self._avail[key]
        self._free_total = None

    def can_place(self, alloc: Allocation) -> bool:
        key = (alloc.kind, alloc.per_node)
        n = self._avail.get(key)
        if n is None:
            t, b, need = self.node_total, self.node_busy, alloc.per_node
            n = sum(1 for i in self._nodes.get(alloc.kind, ()) if t[i] - b[i] >= need)
            self._avail[key] = n
        return n >= alloc.num_nodes

    def place(self, alloc: Allocation) -> Placement | None:
        """Best fit: the fullest nodes of the kind that still have `per_node` free (fragmentation stays low), or None."""
        if not self.can_place(alloc):
            return None
        need = alloc.per_node
        t, b = self.node_total, self.node_busy
        cands = [(t[i] - b[i], i) for i in self._nodes[alloc.kind] if t[i] - b[i] >= need]
        cands.sort()
        return Placement(alloc, tuple((i, need) for _, i in cands[: alloc.num_nodes]))

    def take(self, p: Placement) -> None:
        for i, n in p.nodes:
            assert self.node_busy[i] + n <= self.node_total[i], "placement over a node's capacity"
            self.node_busy[i] += n
        self.invalidate({self.node_kind[i] for i, _ in p.nodes})

    def release(self, p: Placement) -> None:
        for i, n in p.nodes:
            assert self.node_busy[i] >= n, "releasing devices that are not busy"
            self.node_busy[i] -= n
        self.invalidate({self.node_kind[i] for i, _ in p.nodes})


@dataclass(frozen=True, slots=True)
class Action:
    """One thing a round does to one job: start, resize (grow/shrink/move) or keep; with the plan and why."""

    job_id: str
    kind: str  # "start" | "grow" | "shrink" | "move"
    placement: Placement
    iter_time_s: float
    plan: str
    reason: str
    base: Allocation | None = None  # the efficient allocation it was admitted with (a shrink returns there)


@dataclass(frozen=True, slots=True)
class Rejection:
    job_id: str
    reason: str


@dataclass(frozen=True)
class Decision:
    policy: str
    actions: tuple[Action, ...]
    rejections: tuple[Rejection, ...]
    waiting: tuple[str, ...]
    speed_queries: int = 0
