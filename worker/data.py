"""Training data: deterministic global batches, of which each replica reads its own rows.

A global batch of `global_batch_size` samples is a pure function of (source, seed, step, row), so
any layout — one process, a pipeline, unequal replicas — sees exactly the same tokens at a given
step, and a resumed run continues the stream from its checkpointed step. Replica r reads rows
[sum(shares[:r]), sum(shares[:r+1])) of each global batch: disjoint slices that cover it.

Sources:
- "synthetic": seeded arithmetic sequences x_i = (start + i*stride) mod vocab (start, stride drawn
  per row). Learnable, so the loss falls, yet no file is needed.
- a folder `meshplan data prepare` wrote (planner/specs/dataset.py): its packed token file, read
  through numpy's memmap as the corpus is read: row j of step s starts at token ((s*G + j) * seq_len)
  mod (N - seq_len - 1) of the split, so a run's position is its step and a resumed, resized or
  re-planned run reads exactly the tokens an uninterrupted one reads. `split="val"` reads the held-out
  tokens (validation: batch b's rows from ((b*G + j) * seq_len)).
- "text": the shipped English corpus (worker/data/corpus.txt), byte-level tokens (vocab 256, which
  the tiny presets' padded vocab of 256 holds). Rows read the corpus sequentially: row j of step s
  starts at byte ((s*G + j) * seq_len) mod (N - seq_len - 1), so an epoch is a linear pass.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from planner.errors import MeshplanError
from planner.specs.dataset import (
    MANIFEST,
    Manifest,
    check_fits,
    is_prepared,
    manifest_from_text,
    missing_manifest,
    tokens_file,
)

DataSource = Literal["synthetic", "text"]
CORPUS = "corpus.txt"


@lru_cache(maxsize=1)
def corpus_tokens() -> torch.Tensor:
    """The shipped corpus as byte tokens (int64)."""
    # Next to this file (package data); not importlib.resources: under pytest `worker` can resolve as
    # a namespace package spanning tests/worker, whose MultiplexedPath cannot open files.
    raw = (Path(__file__).parent / "data" / CORPUS).read_bytes()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)


def replica_rows(batch_shares: tuple[int, ...] | list[int], replica: int) -> range:
    """Rows of the global batch that `replica` processes."""
    start = sum(batch_shares[:replica])
    return range(start, start + batch_shares[replica])


@lru_cache(maxsize=4)
def prepared_tokens(folder: str, split: str) -> tuple[np.ndarray, Manifest]:
    """A prepared dataset's split as a read-only memmap (opened once per process) and its manifest."""
    path = Path(folder)
    try:
        text = (path / MANIFEST).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        raise missing_manifest(path) from None
    manifest = manifest_from_text(text, str(path / MANIFEST))
    file = tokens_file(path, split)  # type: ignore[arg-type]
    if not file.is_file() or file.stat().st_size == 0:
        return np.zeros(0, dtype=manifest.dtype), manifest
    return np.memmap(file, dtype=manifest.dtype, mode="r"), manifest


def batch_rows(
    source: str,
    step: int,
    rows: range,
    global_batch: int,
    seq_len: int,
    vocab_size: int,
    seed: int = 0,
    split: str = "train",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each [len(rows), seq_len] int64, for `rows` of global batch `step`.

    Targets are the inputs shifted by one token (next-token prediction).
    """
    if is_prepared(source):
        tokens, manifest = prepared_tokens(source, split)
        check_fits(manifest, vocab_size)
        span = tokens.shape[0] - seq_len - 1
        if span <= 0:
            raise MeshplanError(
                "--data",
                source,
                f"its {split} split has {tokens.shape[0]} tokens, fewer than one sequence of {seq_len}",
            )
        starts = [((step * global_batch + j) * seq_len) % span for j in rows]
        windows = torch.from_numpy(np.stack([tokens[s : s + seq_len + 1].astype(np.int64) for s in starts]))
    elif source == "text":
        tokens = corpus_tokens()
        if vocab_size < 256:
            raise MeshplanError(
                "data", "text", f"byte tokens need vocab_size >= 256 (model has {vocab_size}); use synthetic"
            )
        span = tokens.numel() - seq_len - 1
        if span <= 0:
            raise MeshplanError(
                "seq_len", seq_len, f"the corpus has only {tokens.numel()} bytes; use a shorter sequence"
            )
        starts = [((step * global_batch + j) * seq_len) % span for j in rows]
        windows = torch.stack([tokens[s : s + seq_len + 1] for s in starts])
    elif source == "synthetic":
        out = []
        for j in rows:
            # One generator per (seed, step, row): rows are independent of which replica asks.
            g = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 65_537 + j) & 0x7FFF_FFFF_FFFF)
            start = int(torch.randint(vocab_size, (1,), generator=g))
            stride = int(torch.randint(1, 8, (1,), generator=g))
            out.append((start + stride * torch.arange(seq_len + 1)) % vocab_size)
        windows = torch.stack(out)
    else:
        raise MeshplanError("data", source, "use 'synthetic', 'text' or a folder `meshplan data prepare` wrote")
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
