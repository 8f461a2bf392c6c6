"""`meshplan data prepare` as a flow: the user's files tokenized once into a token dataset
(storage/dataset.py; the layout in planner/specs/dataset.py), read by `train --data DIR`."""

from __future__ import annotations

import time

from prefect import flow

from flows.outcomes import DataOutcome
from tasks.data import tokenize_dataset


@flow(name="data-prepare", log_prints=True)
def data_prepare_flow(
    inputs: list[str], tokenizer: str, out: str, val_fraction: float = 0.01, text_field: str = "text", workers: int = 1
) -> DataOutcome:
    t0 = time.perf_counter()
    m = tokenize_dataset(inputs, tokenizer, out, val_fraction, text_field, workers)
    elapsed = time.perf_counter() - t0
    tokens = m.train.tokens + m.val.tokens
    return DataOutcome(
        out_dir=out,
        vocab_size=m.vocab_size,
        dtype=m.dtype,
        eos_id=m.eos_id,
        num_train_documents=m.train.documents,
        num_train_tokens=m.train.tokens,
        num_val_documents=m.val.documents,
        num_val_tokens=m.val.tokens,
        elapsed_s=elapsed,
        tokens_per_s=tokens / elapsed if elapsed > 0 else 0.0,
    )
