"""Context parallelism as an outer dimension of the search: fold each cp group into one device.

For a degree cp the search runs its ordinary exact passes over *folded* classes: every node of a
class whose node holds n devices (cp dividing n) is seen as n / cp devices, each standing for one
cp group of cp physical devices of that node, and the Pricer prices every stage with
`Stack.cp = cp` (1/cp of a block's work and tokens, the K/V exchange on the node's link, gradients
summed over dp × cp: planner.cost.stage). A folded plan is then expanded to physical ids
(`expand_stage_ids`): folded device f of a node, cp rank c → the node's device c·(n/cp) + (f mod
n/cp), so a tp group stays contiguous in its node and a cp group stays inside it too. Classes
whose nodes cp does not divide sit the cp pass out.

Which degrees (`cp_degrees`): cp > 1 only where it can help, by a stated rule, not a bound. Per
rank, cp does what dp does with the same devices (1/cp of the tokens against 1/dp of the samples,
gradients summed over the same number of ranks) plus a K/V exchange per layer; it pays off where
the sample cannot be split further: one sample's activations do not fit (long sequences), or too
few samples per step leave dp ranks idle or pipelines with few micro-batches. So cp > 1 is
searched when seq ≥ SearchSpace.cp_min_seq (8192 by default: where llama-class activations of one
sample reach tens of GB per stage), or when the cp = 1 passes found no feasible plan (memory
binding). At seq 2048 with a feasible plan the search does exactly the work it did before.
The dp ring of a folded stage is priced over every dp × cp rank on the physical nodes
(arrays.dp_link), as `estimate` prices the built plan's ring, so each cp pass is exact in its part
of the space (tests/planner/test_search_cp.py: equal to the oracle, which enumerates cp too).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.cost.memory import Stack
from planner.search.classes import DeviceClass
from planner.search.space import SearchSpace


def cp_degrees(space: SearchSpace, classes: list[DeviceClass], seq: int, found_plain: bool) -> list[int]:
    """The cp > 1 degrees to search after the cp = 1 passes (module docstring's rule)."""
    if seq < space.cp_min_seq and found_plain:
        return []
    return [c for c in space.context_parallel if c > 1 and seq % (2 * c) == 0 and fold_classes(classes, c).classes]


@dataclass(frozen=True)
class Folding:
    """Classes folded by `cp` and, per folded id range, (folded lo, folded hi, physical lo, m = folded
    devices per node): node starts inside a range are multiples of n physically and of m folded."""

    cp: int
    classes: list[DeviceClass]
    ranges: tuple[tuple[int, int, int, int], ...]

    def physical_id(self, f: int, c: int) -> int:
        """Physical id of cp rank c of folded device f: its node's device c·m + (f mod m)."""
        for lo, hi, plo, m in self.ranges:
            if lo <= f < hi:
                g = f - lo
                return plo + self.cp * (g - g % m) + c * m + g % m
        raise AssertionError(f"folded id {f} out of range")

    def expand_stage_ids(self, ids: tuple[int, ...], tp: int, dp: int) -> tuple[int, ...]:
        """A folded stage's dp × tp ids (replica-major) as the physical dp × cp × tp ids StagePlan lists
        (replica, cp rank, tp rank)."""
        out: list[int] = []
        for r in range(dp):
            group = ids[r * tp : (r + 1) * tp]
            for c in range(self.cp):
                out.extend(self.physical_id(f, c) for f in group)
        return tuple(out)


def fold_classes(classes: list[DeviceClass], cp: int) -> Folding:
    """The classes as cp groups (module docstring): the classes cp divides, n / cp devices per node,
    folded ids numbered from 0 in class order; indices renumbered in order."""
    out, ranges, nxt = [], [], 0
    for c in classes:
        n = c.devices_per_node
        if n % cp:
            continue
        m = n // cp
        spec = c.spec.model_copy(update={"num_devices": m})
        folded = []
        for lo, hi in c.id_ranges:
            size = (hi - lo) // cp
            folded.append((nxt, nxt + size))
            ranges.append((nxt, nxt + size, lo, m))
            nxt += size
        out.append(DeviceClass(len(out), spec, c.num_nodes, tuple(folded)))
    return Folding(cp, out, tuple(ranges))


def with_cp(stack: Stack, cp: int) -> Stack:
    """A pass's stack with context parallelism `cp`."""
    return replace(stack, cp=cp)
