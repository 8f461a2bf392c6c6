"""Ranks of tests/worker/test_serve_tp.py (run under torchrun, not collected by pytest).

Each rank builds its shard of its stage with the serving runtime's own code (worker.serve: my_place,
tp_meshes, build), one batch of tokens goes down every group's pipeline (tp rank i of a stage to tp
rank i of the next, as worker.serve.serve sends), and every last-stage rank saves the logits it holds; every rank saves its parameters' local shapes.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from planner.serve.placement import Placement
from worker.serve import build, my_place, tp_meshes


def tokens_for(vocab: int, batch: int, n: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(7))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--placement", required=True)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pl = Placement.model_validate_json(Path(args.placement).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    me = my_place(pl, rank)
    parts = build(pl, me.group, me.stage, seed=0, mesh=tp_meshes(pl, me))
    specs = {m.name: m for m in pl.models}
    local = {
        f"{name}.{k}": list(p.to_local().shape if hasattr(p, "to_local") else p.shape)
        for name, part in parts.items()
        for k, p in part.named_parameters()
    }
    (Path(args.out_dir) / f"shapes_rank{rank}.json").write_text(json.dumps(local))
    with torch.no_grad():
        for name in pl.groups[me.group].models:
            sm = specs[name]
            if me.stage == 0:
                x = tokens_for(sm.spec.vocab_size, sm.batch, sm.tokens)
            else:
                x = torch.empty(sm.batch, sm.tokens, sm.spec.hidden)
                dist.recv(x, me.rank(me.stage - 1, me.tp_index))
            y = parts[name](x)
            if me.stage == me.pp - 1:
                torch.save(y, Path(args.out_dir) / f"logits_{name}_rank{rank}.pt")
            else:
                dist.send(y.contiguous(), me.rank(me.stage + 1, me.tp_index))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
