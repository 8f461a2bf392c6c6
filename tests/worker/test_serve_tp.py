"""The serving runtime's tensor-parallel stages compute what one process computes with the same weights.

One torchrun of 4 gloo ranks: a pp = 2 × tp = 2 group hosting a GPT-style model (biases, learned
positions) and a Llama-style one (RoPE, SwiGLU, grouped-query attention), each rank its shard of its
stage (tests/worker/serve_tp_ranks.py, built by worker.serve); both tp ranks of the last stage must
hold the single-process logits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from planner.serve.placement import Placement
from tests.worker.serve_tp_ranks import tokens_for
from worker.model import Decoder, init_weights

pytestmark = pytest.mark.dist

DIMS = {"num_layers": 4, "hidden": 64, "num_heads": 4, "vocab_size": 250, "seq_len": 32}
MODELS = [
    {"name": "g", "dims": {"name": "g", **DIMS}, "seq": 16, "batch": 2, "slo_s": 1.0},
    {
        "name": "l",
        "dims": {"name": "l", "family": "llama", "num_kv_heads": 2, "ffn_hidden": 96, **DIMS},
        "seq": 16,
        "slo_s": 1.0,
    },
]


def test_pp2_tp2_serving_shards_match_a_single_process_forward(tmp_path) -> None:
    placement = {
        "method": "manual",
        "cluster": "cpu-4",
        "dtype": "fp32",
        "models": MODELS,
        "groups": [{"devices": [0, 1, 2, 3], "kind": "cpu", "pp": 2, "tp": 2, "models": ["g", "l"]}],
    }
    path = tmp_path / "placement.json"
    path.write_text(json.dumps(placement))
    cmd = ["timeout", "-k", "10", "120", sys.executable, "-m", "worker.agent", "--nproc-per-node", "4"]
    cmd += ["-m", "tests.worker.serve_tp_ranks", "--placement", str(path), "--out-dir", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, start_new_session=True)
    assert p.returncode == 0, p.stderr[-4000:]
    pl = Placement.model_validate(placement)
    for sm in pl.models:
        whole = Decoder(sm.spec)
        init_weights(whole, 0, sm.spec.num_layers)
        with torch.no_grad():
            want = whole.eval()(tokens_for(sm.spec.vocab_size, sm.batch, sm.tokens))
        for rank in (2, 3):  # the last stage's two tp ranks
            got = torch.load(tmp_path / f"logits_{sm.name}_rank{rank}.pt")
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
            assert torch.equal(got[:, -1].argmax(-1), want[:, -1].argmax(-1))
    # each rank holds half of every split weight (the check above would also pass unsplit)
    first, last = (json.loads((tmp_path / f"shapes_rank{r}.json").read_text()) for r in (0, 3))
    vocab = pl.models[0].spec.padded_vocab
    assert first["g.embed.tok.weight"] == [vocab // 2, 64] and last["g.head.out.weight"] == [vocab // 2, 64]
    assert first["g.blocks.0.attn.wq.weight"] == [32, 64] and first["g.blocks.0.attn.wo.weight"] == [64, 32]
    assert last["l.blocks.3.attn.wk.weight"] == [16, 64] and last["l.blocks.3.mlp.w2.weight"] == [64, 48]
    assert "g.blocks.3.mlp.w1.weight" not in first and "g.embed.tok.weight" not in last  # pp = 2 stages
