"""worker.parallel.GradSumSync on 2 real gloo ranks: packed and in-place buckets both sum exactly."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from worker.parallel import GradSumSync

pytestmark = pytest.mark.dist


def _rank(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        # 4 KiB buckets: the 16 KiB weight is reduced in place, the small ones go through the buffer
        module = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(4, 4), nn.Linear(4, 2))
        sync = GradSumSync(module, dist.group.WORLD, bucket_bytes=4096)
        seen = []
        for step in range(2):
            for i, p in enumerate(module.parameters()):
                p.grad = torch.full_like(p, float((rank + 1) * (i + 1) * (step + 1)))
            big = module[0].weight.grad
            ptr = big.data_ptr()
            sync()
            assert module[0].weight.grad.data_ptr() == ptr, "a bucket-sized gradient is reduced in place"
            for i, p in enumerate(module.parameters()):
                assert torch.equal(p.grad, torch.full_like(p, 3.0 * (i + 1) * (step + 1))), (step, i)
            assert sync._flat is not None and sync._flat.numel() == sum(
                p.numel() for p in list(module.parameters())[1:]
            )  # only the small gradients were packed
            seen.append(sync._flat.data_ptr())
        assert seen[0] == seen[1], "the packing buffer is allocated once, not per step"
        if rank == 0:
            with open(out, "w") as f:
                f.write("ok")
    finally:
        dist.barrier()  # before destroy: gloo's exit-time abort otherwise
        dist.destroy_process_group()


def test_packed_and_in_place_buckets_sum_over_ranks_and_reuse_one_buffer(tmp_path):
    out = tmp_path / "ok"
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    assert out.read_text() == "ok"
