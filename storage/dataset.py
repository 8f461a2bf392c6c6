"""`meshplan data prepare`: the user's text, JSONL or Parquet tokenized once into a token dataset.

Documents: a `.txt` file's non-empty lines (as Hugging Face datasets' `text` loader reads them), a
`.jsonl` file's objects' `text_field`, a `.parquet` file's `text_field` column (polars) — in the order
given. Each is encoded with the Hugging Face `tokenizers` tokenizer (batched; `workers` > 1 spreads
batches over processes), followed by the end-of-text token when the tokenizer has one, and packed
end to end into `train.bin` / `val.bin` with the documents' start offsets beside them (the layout is
planner/specs/dataset.py's). Document i goes to validation when ⌊(i+1)·f⌋ > ⌊i·f⌋ for the validation
fraction f: exactly ⌊n·f⌋ documents, spread evenly through the input, the same on every run.

Written into a staging folder that is renamed onto `--out` only when whole: a failed or interrupted
prepare leaves nothing at `--out`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from planner.errors import MeshplanError
from planner.specs.dataset import (
    MANIFEST,
    TOKENIZER,
    Manifest,
    SplitInfo,
    dtype_for,
    index_file,
    manifest_from_text,
    missing_manifest,
    tokens_file,
)

EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
BATCH = 512  # documents per encode_batch call


def read_manifest(folder: Path, flag: str = "--data") -> Manifest:
    path = folder / MANIFEST
    if not path.is_file():
        raise missing_manifest(folder, flag)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise MeshplanError(flag, str(path), "not UTF-8 text; prepare the data again") from None
    return manifest_from_text(text, str(path), flag)


def tokenizer_path(tokenizer: Path) -> Path:
    path = tokenizer / TOKENIZER if tokenizer.is_dir() else tokenizer
    if not path.is_file():
        raise MeshplanError(
            "--tokenizer", str(tokenizer), f"no {TOKENIZER} there; pass a tokenizers JSON file or its folder"
        )
    return path


def load_tokenizer(path: Path):  # -> tokenizers.Tokenizer
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MeshplanError(
            "--tokenizer", str(path), "needs the `tokenizers` package: pip install tokenizers"
        ) from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception type for a malformed file
        raise MeshplanError("--tokenizer", str(path), f"not a tokenizers JSON file ({str(exc)[:120]})") from None


def documents(path: Path, text_field: str) -> Iterator[str]:
    """The documents of one input file, in order."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise MeshplanError("--input", str(path), "no such file")
    if suffix == ".parquet":
        import polars as pl

        try:
            frame = pl.read_parquet(path, columns=[text_field])
        except Exception as exc:  # polars: ColumnNotFoundError, ComputeError, ...
            raise MeshplanError("--text-field", text_field, f"{path.name}: {str(exc).splitlines()[0][:120]}") from None
        yield from (t for t in frame[text_field].to_list() if isinstance(t, str) and t)
        return
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if suffix in (".jsonl", ".json"):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise MeshplanError("--input", f"{path.name}:{n}", f"not a JSON line ({exc.msg})") from None
                    text = row.get(text_field) if isinstance(row, dict) else None
                    if not isinstance(text, str):
                        raise MeshplanError(
                            "--text-field", text_field, f"{path.name}:{n} has no string field {text_field!r}"
                        )
                    if text:
                        yield text
                elif line.strip():
                    yield line.rstrip("\n")
    except UnicodeDecodeError:
        raise MeshplanError("--input", str(path), "not UTF-8 text; convert it to UTF-8") from None


_WORKER_TOKENIZER = None


def _init_worker(path: str) -> None:
    global _WORKER_TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    _WORKER_TOKENIZER = Tokenizer.from_file(path)


def _encode(batch: list[str]) -> list[list[int]]:
    assert _WORKER_TOKENIZER is not None
    return [e.ids for e in _WORKER_TOKENIZER.encode_batch(batch, add_special_tokens=False)]


def _batches(inputs: list[Path], text_field: str) -> Iterator[list[str]]:
    batch: list[str] = []
    for path in inputs:
        for doc in documents(path, text_field):
            batch.append(doc)
            if len(batch) == BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _SplitWriter:
    def __init__(self, folder: Path, split: str, dtype: str) -> None:
        self.tokens = tokens_file(folder, split).open("wb")  # type: ignore[arg-type]
        self.index = index_file(folder, split)  # type: ignore[arg-type]
        self.starts: list[int] = []
        self.count = 0
        self.dtype = np.dtype(dtype)

    def add(self, ids: list[int]) -> None:
        self.starts.append(self.count)
        self.tokens.write(np.asarray(ids, dtype=self.dtype).tobytes())
        self.count += len(ids)

    def close(self) -> None:
        self.tokens.close()
        np.asarray(self.starts, dtype=np.int64).tofile(self.index)


def prepare(
    inputs: list[Path],
    tokenizer: Path,
    out: Path,
    val_fraction: float = 0.01,
    text_field: str = "text",
    workers: int = 1,
    eos_token: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Tokenize `inputs` into a dataset folder at `out` (see the module doc); its manifest."""
    if not inputs:
        raise MeshplanError("--input", None, "give at least one text, JSONL or Parquet file")
    if not 0 <= val_fraction < 1:
        raise MeshplanError("--val-fraction", val_fraction, "must be in [0, 1)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MeshplanError("--out", str(out), "exists and is not empty; pick a new folder or remove it")
    for path in inputs:
        if path.suffix.lower() not in (".txt", ".jsonl", ".json", ".parquet"):
            raise MeshplanError("--input", str(path), "use .txt (a document per line), .jsonl or .parquet")
    tok_path = tokenizer_path(tokenizer)
    tok = load_tokenizer(tok_path)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if eos_token is not None:
        eos_id = tok.token_to_id(eos_token)
        if eos_id is None:
            raise MeshplanError("--eos-token", eos_token, "not a token of this tokenizer")
    else:
        eos_id = next((i for t in EOS_CANDIDATES if (i := tok.token_to_id(t)) is not None), None)
    dtype = dtype_for(vocab)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        writers = {"train": _SplitWriter(stage, "train", dtype), "val": _SplitWriter(stage, "val", dtype)}
        seen = 0
        pool = (
            ProcessPoolExecutor(
                workers, mp_context=get_context("spawn"), initializer=_init_worker, initargs=(str(tok_path),)
            )
            if workers > 1
            else None
        )
        try:
            if pool is None:
                _init_worker(str(tok_path))
                encoded = map(_encode, _batches(inputs, text_field))
            else:
                encoded = pool.map(_encode, _batches(inputs, text_field))
            for ids_batch in encoded:
                for ids in ids_batch:
                    if eos_id is not None:
                        ids = [*ids, eos_id]
                    to_val = int((seen + 1) * val_fraction) > int(seen * val_fraction)
                    writers["val" if to_val else "train"].add(ids)
                    seen += 1
                if on_progress is not None:
                    on_progress(seen, writers["train"].count + writers["val"].count)
        finally:
            if pool is not None:
                pool.shutdown()
        for w in writers.values():
            w.close()
        if seen == 0:
            raise MeshplanError("--input", " ".join(map(str, inputs)), "holds no documents (empty files?)")
        if writers["train"].count == 0:
            raise MeshplanError("--val-fraction", val_fraction, "leaves no training tokens; use a smaller fraction")
        shutil.copyfile(tok_path, stage / TOKENIZER)
        manifest = Manifest(
            dtype=dtype,
            vocab_size=vocab,
            eos_id=eos_id,
            train=SplitInfo(
                documents=len(writers["train"].starts),
                tokens=writers["train"].count,
                sha256=_sha256(tokens_file(stage, "train")),
            ),
            val=SplitInfo(
                documents=len(writers["val"].starts),
                tokens=writers["val"].count,
                sha256=_sha256(tokens_file(stage, "val")),
            ),
            sources=tuple(str(p.resolve()) for p in inputs),
            text_field=text_field,
            val_fraction=val_fraction,
        )
        (stage / MANIFEST).write_text(manifest.model_dump_json(indent=2))
        if out.exists():
            out.rmdir()  # empty (checked above)
        stage.rename(out)
        return manifest
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
