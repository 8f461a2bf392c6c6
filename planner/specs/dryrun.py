"""A plan's dry run: its exact layout on a model scaled down until CPU ranks run it in seconds.

`meshplan train --plan plan.json --dry-run` launches the plan as it is — ranks, per-stage meshes,
stage splits (layers per stage), schedule, batch shares and so micro-batch counts — on local CPU
ranks, with the model's dimensions shrunk: what must launch is the layout, and the layout does not
depend on the width of a layer. What is kept, and why:
- num_layers: the stage splits are ranges of blocks;
- family (norms, MLP, positions) and grouped-query attention: they choose which modules are built
  and how tensor parallelism splits them;
- every stage's tp divides heads and kv heads (DTensor's column split cuts whole heads): kv heads =
  L = lcm of the stages' tp, heads = L (multi-head) or 2L (grouped-query);
- the plan's micro-batch size and batch shares.
What shrinks: head dim DRY_HEAD_DIM (hidden = heads × head dim), ffn = 2 × hidden (a multiple of
every tp), vocabulary DRY_VOCAB and sequence length DRY_SEQ (rounded up to a multiple of 2·cp). The plan's prediction, for the real
model, is dropped from the dry plan.
"""

from __future__ import annotations

import math

from planner.specs.model import ModelSpec
from planner.specs.plan import Plan

DRY_HEAD_DIM = 16
DRY_VOCAB = 256
DRY_SEQ = 16


def dry_run_model(model: ModelSpec, plan: Plan) -> ModelSpec:
    """`model` scaled down for a dry run of `plan` (see the module docstring)."""
    lcm_tp = math.lcm(*(s.tp for s in plan.stages))
    grouped = model.kv_heads < model.num_heads
    heads = 2 * lcm_tp if grouped else lcm_tp
    hidden = heads * DRY_HEAD_DIM
    return ModelSpec(
        name=f"{model.name}-dry",
        family=model.family,
        num_layers=model.num_layers,
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=lcm_tp if grouped else None,
        ffn_hidden=2 * hidden,
        vocab_size=DRY_VOCAB,
        # a multiple of 2·cp: context parallelism cuts the sequence into 2·cp chunks
        seq_len=min(plan.seq_len, -(-DRY_SEQ // (2 * plan.cp)) * 2 * plan.cp),
        tie_embeddings=model.tie_embeddings,
        learned_positions=model.learned_positions,
    )


def dry_run_plan(plan: Plan, dry_model: ModelSpec) -> Plan:
    """`plan` at the dry model's sequence length, without the real model's prediction; layout unchanged."""
    return plan.model_copy(update={"seq_len": dry_model.seq_len, "predicted": None})
