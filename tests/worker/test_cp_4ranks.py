"""Context parallelism layouts on 4 local gloo ranks against the single process: pp2 × cp2 (gpipe), tp2 × cp2
with sequence parallelism (tiny-llama). Every parameter after 2 SGD steps equals the reference within 2e-5.

Runs only where there are 4 cores (4 ranks sharing 2 would time out the suite, which runs 2-rank jobs):
    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/worker/test_cp_4ranks.py
"""

import os

import pytest

from tests.worker.conftest import plan_dict, run_torchrun
from tests.worker.test_train_dist import SGD, assert_matches_reference


def _layouts():
    pp = plan_dict([(0, 2), (2, 4)], mbs=2, schedule="gpipe")
    pp["stages"][0].update(cp=2, device_ids=[0, 1])
    pp["stages"][1].update(cp=2, device_ids=[2, 3])
    tp = plan_dict([(0, 4)], tp=2, model="tiny-llama")
    tp["stages"][0].update(cp=2, device_ids=[0, 1, 2, 3], sequence_parallel=True)
    return {"pp2 x cp2": (pp, "tiny"), "tp2 x cp2 + sp": (tp, "tiny-llama")}


@pytest.mark.dist
@pytest.mark.skipif((os.cpu_count() or 1) < 4, reason="4 gloo ranks need 4 cores")
@pytest.mark.parametrize("name", list(_layouts()))
def test_cp_layout_on_4_ranks_matches_the_single_process(name, tmp_path):
    plan, model = _layouts()[name]
    run_dir = tmp_path
    run_torchrun(run_dir, plan, 4, "--steps", "2", *SGD)
    assert_matches_reference(run_dir, model, 2)
