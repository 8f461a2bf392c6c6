"""What a dry run proved: the ranks' telemetry checked against the plan's layout (planner/runtime.py).

A dry run (planner/specs/dryrun.py) passes when every step it was asked for was reported by every
rank of the plan, each rank from the slot the rank map gives it (stage, replica, tp index), and
every loss the last stages logged is finite. The report says which ranks ran which stage on which of
the plan's devices, so a user reads the layout that launched, not only "exit 0".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from planner.runtime import rank_map
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan


@dataclass(frozen=True)
class StageLayout:
    stage: int
    layers: tuple[int, int]  # [start, end) blocks
    tp: int
    dp: int
    ranks: tuple[int, ...]
    device_ids: tuple[int, ...]  # the plan's devices these ranks stand for, in rank order


@dataclass(frozen=True)
class DryRunReport:
    plan_fingerprint: str  # the plan the user gave (the dry plan differs only in seq and prediction)
    world_size: int
    schedule: str
    num_microbatches: tuple[int, ...]  # per replica
    stages: tuple[StageLayout, ...]
    steps: int  # asked for
    steps_done: int  # reported by every rank
    losses: tuple[float | None, ...]
    model: ModelSpec  # the scaled-down model that ran
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        m = self.model
        out = [
            f"dry run of plan {self.plan_fingerprint}: {self.world_size} ranks, {self.schedule}, "
            f"micro-batches per replica {list(self.num_microbatches)}",
            f"model scaled to {m.num_layers} layers, hidden {m.hidden}, heads {m.num_heads}/{m.kv_heads}, "
            f"ffn {m.ffn}, vocab {m.vocab_size}, seq {m.seq_len}",
        ]
        for s in self.stages:
            out.append(
                f"stage {s.stage}: layers {s.layers[0]}-{s.layers[1] - 1}, tp{s.tp}×dp{s.dp}, "
                f"ranks {list(s.ranks)} = plan devices {list(s.device_ids)}"
            )
        losses = ", ".join("-" if v is None else f"{v:.4f}" for v in self.losses)
        out.append(f"steps {self.steps_done}/{self.steps} completed on every rank; losses {losses}")
        out += [f"problem: {p}" for p in self.problems]
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "plan": self.plan_fingerprint,
            "world_size": self.world_size,
            "schedule": self.schedule,
            "num_microbatches": list(self.num_microbatches),
            "stages": [
                {
                    "stage": s.stage,
                    "layers": list(s.layers),
                    "tp": s.tp,
                    "dp": s.dp,
                    "ranks": list(s.ranks),
                    "device_ids": list(s.device_ids),
                }
                for s in self.stages
            ],
            "steps": self.steps,
            "steps_done": self.steps_done,
            "losses": list(self.losses),
            "model": self.model.model_dump(mode="json"),
            "problems": list(self.problems),
        }


def stage_layouts(plan: Plan) -> tuple[StageLayout, ...]:
    slots = rank_map(plan)
    return tuple(
        StageLayout(
            i,
            (s.layer_start, s.layer_end),
            s.tp,
            s.dp,
            tuple(sl.rank for sl in slots if sl.stage == i),
            tuple(sl.device_id for sl in slots if sl.stage == i),
        )
        for i, s in enumerate(plan.stages[: plan.pp])
    )


def dry_run_report(
    plan: Plan,
    dry_model: ModelSpec,
    rows: Iterable[Mapping[str, Any]],
    steps: int,
    losses: Iterable[float | None] = (),
) -> DryRunReport:
    """Check the ranks' telemetry `rows` (step_metrics) of a dry run of `plan` asked for `steps` steps."""
    rows = list(rows)
    slots = rank_map(plan)
    world = len(slots)
    problems: list[str] = []
    seen: dict[int, tuple[int, int, int]] = {}
    for r in rows:
        where = (int(r["stage"]), int(r["replica"]), int(r["tp_index"]))
        rank = int(r["rank"])
        if not 0 <= rank < world:
            problems.append(f"rank {rank} reported, but the plan has ranks 0..{world - 1}")
            continue
        sl = slots[rank]
        if where != (sl.stage, sl.replica, sl.tp_index):
            problems.append(
                f"rank {rank} ran stage {where[0]} replica {where[1]} tp index {where[2]}; "
                f"the rank map puts it at stage {sl.stage} replica {sl.replica} tp index {sl.tp_index}"
            )
        seen[rank] = where
        loss = r.get("loss")
        if loss is not None and not math.isfinite(loss):
            problems.append(f"rank {rank} logged loss {loss} at step {r['step']}")
    by_step: dict[int, set[int]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), set()).add(int(r["rank"]))
    done = 0
    while by_step.get(done) == set(range(world)):
        done += 1
    if done < steps:
        missing = sorted(set(range(world)) - by_step.get(done, set()))
        problems.append(f"step {done} was not reported by ranks {missing} (of {world})")
    silent = sorted(set(range(world)) - set(seen))
    if silent and done >= steps:
        problems.append(f"ranks {silent} reported nothing")
    return DryRunReport(
        plan.fingerprint(),
        world,
        plan.schedule,
        tuple(plan.num_microbatches(r) for r in range(plan.dp)),
        stage_layouts(plan),
        steps,
        min(done, steps),
        tuple(losses),
        dry_model,
        tuple(dict.fromkeys(problems)),  # one line per distinct problem
    )
