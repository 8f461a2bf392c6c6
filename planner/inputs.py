"""The one reader of every file a user hands meshplan (cluster, model, plan, config, workload,
placement, trace, replay, runs CSV, jobs CSV, speed table, discovery snapshot).

Checked once, here, before any parser sees the text: the file exists and is a file, it is no
larger than its kind's bound (`planner/limits.py` says why each), it is text (no NUL byte) and it
is UTF-8. Each failure is one `MeshplanError` naming the flag, the file and the fix, so no
command meets a `UnicodeDecodeError` or spends minutes parsing a file no cluster needs. The parse
itself stays with the format's owner (`planner.validation.parse_toml`, `parse_json`, the CSV
readers), each of which names the file and line.

Standard library only: the CLI, the flows and storage all read through it, and the pure core may
(it reads bytes and decodes them; it opens nothing else).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planner.errors import MeshplanError
from planner.limits import MAX_INPUT_BYTES, MAX_TABLE_BYTES

# kinds of file read through here whose bound is MAX_TABLE_BYTES (rows of data); every other kind
# is a description (cluster, model, plan, config, workload, placement) bounded by MAX_INPUT_BYTES
TABLES = frozenset({"trace", "replay", "runs", "jobs", "speed", "snapshot"})


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def read_input(path: str | Path, flag: str, kind: str, fix: str = "") -> str:
    """The text of the user's `kind` file at `path` (given as `flag`), or one MeshplanError.

    `fix` is appended to the missing-file message (e.g. where to find an example)."""
    p = Path(path)
    shown = str(path)
    if not p.exists():
        raise MeshplanError(flag, shown, f"no such file; pass an existing {kind} file" + (f" ({fix})" if fix else ""))
    if not p.is_file():
        raise MeshplanError(flag, shown, f"not a file (a folder or device); pass a {kind} file")
    limit = MAX_TABLE_BYTES if kind in TABLES else MAX_INPUT_BYTES
    size = p.stat().st_size
    if size > limit:
        raise MeshplanError(
            flag,
            shown,
            f"{_mib(size)} is larger than any {kind} file needs (the bound is {_mib(limit)}); "
            f"pass the {kind} file itself, not a different or generated file",
        )
    with p.open("rb") as f:
        raw = f.read(limit + 1)  # a file growing while read is still bounded
    if len(raw) > limit:
        raise MeshplanError(flag, shown, f"larger than {_mib(limit)}; pass the {kind} file itself")
    return decode_input(raw, shown, flag, kind)


def decode_input(raw: bytes, shown: str, flag: str, kind: str) -> str:
    """`raw` as text, or one MeshplanError naming the first byte that is not UTF-8 text."""
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise MeshplanError(
            flag, shown, f"a binary file (a NUL byte at offset {nul}), not a {kind} file; pass the text {kind} file"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        bad = raw[exc.start : exc.start + 1].hex()
        raise MeshplanError(
            flag,
            shown,
            f"not UTF-8 text (byte 0x{bad} on line {line}); save the {kind} file as UTF-8 "
            "(e.g. `iconv -f latin1 -t utf-8`)",
        ) from None
    return text.removeprefix("\ufeff")  # a byte-order mark some editors write


def parse_json(text: str, origin: str, fix: str = "check the file") -> Any:
    """JSON text to a value; a syntax error (or a number JSON cannot hold) names the file, line and column.
    NaN and Infinity, which Python's json accepts but JSON does not have, are refused too."""

    def _no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise MeshplanError(
            origin, "JSON", f"not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno}); {fix}"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise MeshplanError(origin, "JSON", f"not valid JSON ({exc}); {fix}") from None
