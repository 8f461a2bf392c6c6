"""A prepared dataset's batches are a pure function of (step, row): every layout reads the same tokens.

So a run resumed at step s, resized to other batch shares or re-planned reads exactly what an
uninterrupted run reads from step s on (its checkpoint stores the step; worker/data.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from planner.errors import MeshplanError
from planner.specs.dataset import Manifest, SplitInfo
from worker.data import batch_rows, replica_rows


@pytest.fixture
def dataset(tmp_path):
    rng = np.random.default_rng(0)
    tokens = {"train": rng.integers(0, 1000, 5000, dtype=np.uint16), "val": rng.integers(0, 1000, 300, dtype=np.uint16)}
    for split, t in tokens.items():
        t.tofile(tmp_path / f"{split}.bin")
        np.asarray([0], dtype=np.int64).tofile(tmp_path / f"{split}.idx")
    info = {s: SplitInfo(documents=1, tokens=int(t.size), sha256="-") for s, t in tokens.items()}
    m = Manifest(
        dtype="uint16", vocab_size=1000, train=info["train"], val=info["val"], sources=("x",), val_fraction=0.05
    )
    (tmp_path / "manifest.json").write_text(m.model_dump_json())
    return tmp_path, tokens


@pytest.mark.parametrize("shares", [(8,), (4, 4), (1, 7), (3, 2, 3)])
def test_every_split_of_the_batch_reads_the_rows_of_the_whole_batch(dataset, shares):
    folder, tokens = dataset
    for step in (0, 5, 77):  # 77 wraps around the 5,000 tokens
        whole_x, whole_y = batch_rows(str(folder), step, range(8), 8, 16, 1000)
        parts = [batch_rows(str(folder), step, replica_rows(shares, r), 8, 16, 1000) for r in range(len(shares))]
        assert torch.equal(torch.cat([p[0] for p in parts]), whole_x)
        assert torch.equal(torch.cat([p[1] for p in parts]), whole_y)
        assert torch.equal(whole_x[:, 1:], whole_y[:, :-1])  # next-token targets
    x, _ = batch_rows(str(folder), 0, range(2), 8, 16, 1000)
    assert x[0].tolist() == tokens["train"][:16].astype(int).tolist()  # the file's own tokens, in order
    v, _ = batch_rows(str(folder), 0, range(1), 8, 16, 1000, split="val")
    assert v[0].tolist() == tokens["val"][:16].astype(int).tolist()


def test_a_vocabulary_the_model_cannot_hold_is_one_line(dataset):
    folder, _ = dataset
    with pytest.raises(MeshplanError, match="vocabulary is 512"):
        batch_rows(str(folder), 0, range(2), 8, 16, 512)
    (folder / "manifest.json").unlink()
    with pytest.raises(MeshplanError, match="manifest.json"):
        batch_rows(str(folder) + "/", 0, range(2), 8, 16, 1000)
