"""Prefect task of `meshplan data prepare`: tokenize the user's files into a token dataset.

NO_CACHE: its effect is the folder it writes (refused when `--out` exists), so a cached result
without the folder would be a lie; no retries: a tokenizer error is not transient, and a failed
attempt leaves nothing at `--out` (storage/dataset.py stages the folder and renames it whole).
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from launcher.progress import say
from planner.specs.dataset import Manifest
from storage.dataset import prepare


@task(name="tokenize-dataset", cache_policy=NO_CACHE, retries=0)
def tokenize_dataset(
    inputs: list[str], tokenizer: str, out: str, val_fraction: float, text_field: str, workers: int
) -> Manifest:
    last = [0]

    def progress(docs: int, tokens: int) -> None:
        if docs - last[0] >= 10_000:  # a line every 10k documents (a plain line also reaches the run log)
            last[0] = docs
            say(f"tokenized {docs:,} documents, {tokens:,} tokens")

    return prepare(
        [Path(p) for p in inputs], Path(tokenizer), Path(out), val_fraction, text_field, workers, on_progress=progress
    )
