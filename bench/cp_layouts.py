"""Context parallelism layouts checked on 4 local gloo ranks against the single process (not in the
suite, which runs 2-rank jobs): pp2 × cp2 (gpipe), tp2 × cp2 with sequence parallelism (tiny-llama).

    OMP_NUM_THREADS=1 .venv/bin/python bench/cp_layouts.py

Prints one line per layout, "OK" when every parameter after 2 SGD steps equals the reference
within 2e-5 (tests.worker.test_train_dist.assert_matches_reference).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

# the repository root, not bench/ (whose profile.py would shadow the standard library's for pytest)
sys.path[0] = str(Path(__file__).resolve().parents[1])

from tests.worker.conftest import plan_dict, run_torchrun  # noqa: E402
from tests.worker.test_train_dist import SGD, assert_matches_reference  # noqa: E402


def main() -> None:
    pp = plan_dict([(0, 2), (2, 4)], mbs=2, schedule="gpipe")
    pp["stages"][0].update(cp=2, device_ids=[0, 1])
    pp["stages"][1].update(cp=2, device_ids=[2, 3])
    tp = plan_dict([(0, 4)], tp=2, model="tiny-llama")
    tp["stages"][0].update(cp=2, device_ids=[0, 1, 2, 3], sequence_parallel=True)
    for name, plan, model in (("pp2 x cp2", pp, "tiny"), ("tp2 x cp2 + sp", tp, "tiny-llama")):
        run_dir = Path(tempfile.mkdtemp(prefix="meshplan-cp-"))
        run_torchrun(run_dir, plan, 4, "--steps", "2", *SGD)
        assert_matches_reference(run_dir, model, 2)
        print(f"{name}: OK", flush=True)


if __name__ == "__main__":
    main()
