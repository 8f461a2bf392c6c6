"""The multi-job scheduler on a Slurm cluster: the cluster it schedules, read from Slurm each round.

Slurm says which nodes exist, which are up, what each holds (typed GPU gres, or a node feature naming
the kind: `Features=a100` or `cpu`) and which are held by jobs meshplan did not submit; the cluster
file (the template) says what each kind is — its catalog device or, for CPU ranks, its figures, and
its links — because Slurm knows nothing of bandwidths. Nodes down, drained or failing are left out;
nodes any foreign job holds are left out (busy, never touched); nodes meshplan's own jobs hold
(`meshplan-<job>`) are counted, since the scheduler places its running jobs itself. Each admitted
job is one sbatch job per launch (flows/job.py → train_flow with the slurm executor), asking for its
kind (`--gres=gpu:<type>:<n>` or `--constraint=<kind>`) on as many nodes as its allocation has.
"""

from __future__ import annotations

from collections import Counter

from prefect import task
from prefect.cache_policies import NO_CACHE

from launcher.slurm import SlurmJob, SlurmNode, slurm_jobs, slurm_nodes
from planner.errors import MeshplanError
from planner.scheduler.types import kind_alias
from planner.specs.cluster import ClusterSpec

OWN_JOB_PREFIX = "meshplan-"


def node_kind(node: SlurmNode, kinds: set[str]) -> str | None:
    """The node's kind alias: its gres GPU type, else a feature naming a template kind, else None."""
    for cand in (node.gpu_type, *node.features):
        if cand and kind_alias(cand) in kinds:
            return kind_alias(cand)
    return None


def cluster_from_slurm(template: ClusterSpec, nodes: list[SlurmNode], jobs: list[SlurmJob]) -> ClusterSpec:
    """`template`'s node kinds, counted as Slurm has them up and free of foreign jobs."""
    groups = {kind_alias(g.device_kind): g for g in reversed(template.nodes)}  # the first group of a kind wins
    foreign = {n for j in jobs if not j.name.startswith(OWN_JOB_PREFIX) for n in j.nodes}
    counts: Counter[tuple[str, int]] = Counter()
    for node in nodes:
        kind = node_kind(node, set(groups))
        if kind is None or not node.available or node.name in foreign:
            continue
        counts[(kind, node.gpus or min(groups[kind].num_devices, max(node.cpus, 1)))] += 1
    if not counts:
        raise MeshplanError(
            "--cluster", template.name, "Slurm has no free, up node of the file's kinds (gres GPU type or feature)"
        )
    specs = [
        groups[kind].model_copy(update={"name": f"{kind}-x{per_node}", "num_devices": per_node, "count": n})
        for (kind, per_node), n in sorted(counts.items())
    ]
    return ClusterSpec.model_validate({**template.model_dump(), "name": f"slurm-{template.name}", "nodes": specs})


@task(name="read-slurm-cluster", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def read_slurm_cluster(template: ClusterSpec, partition: str | None) -> ClusterSpec:
    """The cluster this round schedules: Slurm's nodes now (scontrol, squeue), the template's kinds."""
    return cluster_from_slurm(template, slurm_nodes(partition), slurm_jobs())


def slurm_resources(kind: str, per_node: int, partition: str | None) -> dict[str, str | None]:
    """How a job asks Slurm for `per_node` devices of `kind` a node: typed gres where the nodes carry it,
    else the kind as a node feature."""
    for node in slurm_nodes(partition):
        if node.gpu_type and kind_alias(node.gpu_type) == kind:
            return {"gres": f"gpu:{node.gpu_type}:{per_node}", "constraint": None}
    return {"gres": None, "constraint": kind}
