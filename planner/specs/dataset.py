"""A prepared token dataset (`meshplan data prepare`): its layout and its manifest, one definition.

The folder holds `train.bin` and `val.bin` (the documents' tokens packed end to end, an end-of-text
token after each document when the tokenizer has one; uint16 when the vocabulary fits, else uint32,
read with numpy's memmap), `train.idx` and `val.idx` (int64 start offsets of each document: the
boundaries, as Megatron's indexed datasets keep them), the tokenizer (`tokenizer.json`) and
`manifest.json` (this model). storage/dataset.py writes it; worker/data.py reads it on the ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import MeshplanError

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
FORMAT = 1
Split = Literal["train", "val"]


def tokens_file(folder: Path, split: Split) -> Path:
    return folder / f"{split}.bin"


def index_file(folder: Path, split: Split) -> Path:
    return folder / f"{split}.idx"


class SplitInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    documents: int = Field(ge=0)
    tokens: int = Field(ge=0)
    sha256: str = Field(description="of the split's token file")


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: int = FORMAT
    dtype: Literal["uint16", "uint32"]
    vocab_size: int = Field(gt=0, description="the tokenizer's vocabulary (ids are below it)")
    eos_id: int | None = Field(default=None, description="the token after each document; None = none")
    train: SplitInfo
    val: SplitInfo
    sources: tuple[str, ...] = Field(description="the input files, in the order read")
    text_field: str | None = None
    val_fraction: float = Field(ge=0, lt=1)


def dtype_for(vocab_size: int) -> Literal["uint16", "uint32"]:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def is_prepared(data: str) -> bool:
    """A `--data` value naming a folder rather than one of the built-in sources."""
    return data not in ("synthetic", "text")


def manifest_from_text(text: str, origin: str, flag: str = "--data") -> Manifest:
    """The manifest a reader read (storage/dataset.py on the flow side, worker/data.py on a rank)."""
    import json

    from planner.validation import parse

    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MeshplanError(
            flag, origin, f"not a manifest meshplan wrote ({exc.msg}); prepare the data again"
        ) from None
    return parse(Manifest, raw, origin=MANIFEST)


def missing_manifest(folder: Path, flag: str = "--data") -> MeshplanError:
    if not folder.is_dir():
        return MeshplanError(
            flag, str(folder), "no such folder; use synthetic, text or a folder `meshplan data prepare` wrote"
        )
    return MeshplanError(
        flag, str(folder), f"no {MANIFEST} there; prepare it with `meshplan data prepare --out {folder}`"
    )


def check_fits(manifest: Manifest, vocab_size: int, flag: str = "--data") -> None:
    """The tokenizer's ids must be rows of the model's embedding."""
    if manifest.vocab_size > vocab_size:
        raise MeshplanError(
            flag,
            manifest.vocab_size,
            f"the dataset's tokenizer has {manifest.vocab_size} ids but the model's vocabulary is {vocab_size}; "
            "use a model with a vocabulary at least as large or another tokenizer",
        )
