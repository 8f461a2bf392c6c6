"""The runtime table: planner/specs/data/runtimes.toml read and validated once, at import.

Every figure `x` of a row must come with a non-empty `x_source`; a row has exactly the keys its kind
names (a missing or unknown key is an error naming the row and the key); fractions lie in [0, 1],
costs are ≥ 0, kinds are one of the listed words, and a runtime's `overlap` names an [[overlap]] row.
planner.cost.overlap builds its `Runtime` values from OVERLAP_ROWS and planner.cost.runtimes its
`RuntimeProfile` values from RUNTIME_ROWS, so the figures live in one sourced place (like
data/gpus.toml, planner.specs.catalog).
"""

from __future__ import annotations

import tomllib
from importlib import resources
from typing import Any

OVERLAP_FRACTIONS = (
    "grad_sync_overlap",
    "reduce_scatter_overlap",
    "gather_overlap",
    "param_gather_overlap",
    "tp_overlap",
    "p2p_overlap",
    "cp_overlap",
)
OVERLAP_FLAGS = (
    "p2p_overlap_interleaved_only",
    "reduce_scatter_every_microbatch",
    "grad_buckets_packed",
    "bucketed_grad_sync",
    "overlaps_on_cpu",
    "fp8_weight_cached",
)
# Flags a row may leave out (absent = false), each with its `_source` where given: mechanisms only a
# few stacks have, so the other rows need not state them.
OVERLAP_OPTIONAL_FLAGS = (
    "grad_allreduce_fp32",
    "p2p_sends_attention_mask",
    "p2p_grad_whole",
    "tied_embedding_allreduce",
    "p2p_blocks_receiver",
    "last_stage_keeps_outputs",
    "eager_module_loading",
)
RUNTIME_WORDS = {"attention": ("sdpa", "flash", "eager"), "loss": ("torch", "vocab-parallel", "fused")}
RUNTIME_FLAGS = ("dropout", "fp8", "sequence_parallel")
KERNEL_KINDS = ("gemm", "attention")
RUNTIME_COSTS = ("launch_s", "microbatch_s")  # seconds, ≥ 0
RUNTIME_COUNTS = ("kernels_per_block", "step_kernels")  # positive integers
FILE = "data/runtimes.toml"


def _check_row(
    kind: str, row: dict[str, Any], figures: tuple[str, ...], plain: tuple[str, ...], optional: tuple[str, ...] = ()
) -> str:
    name = row.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{FILE}: an [[{kind}]] row has no name")
    figures = (*figures, *(f for f in optional if f in row))
    want = {*plain, *figures, *(f"{f}_source" for f in figures)}
    missing, extra = sorted(want - row.keys()), sorted(row.keys() - want)
    if missing or extra:
        raise ValueError(f"{FILE} [[{kind}]] {name}: missing {missing or 'nothing'}, unknown {extra or 'nothing'}")
    for f in (*figures, "source"):
        src = row[f"{f}_source" if f != "source" else "source"]
        if not isinstance(src, str) or not src.strip():
            raise ValueError(f"{FILE} [[{kind}]] {name}: {f} needs a source string")
    return name


def _bad(kind: str, name: str, key: str, value: object, want: str) -> ValueError:
    return ValueError(f"{FILE} [[{kind}]] {name}: {key} = {value!r}, {want}")


Rows = dict[str, dict[str, Any]]


def parse_table(text: str) -> tuple[Rows, Rows, Rows]:
    """([[overlap]] rows, [[runtime]] rows, [[kernel]] rows) by name from the TOML `text`; ValueError naming the row
    and the key of the first bad figure."""
    doc = tomllib.loads(text)
    overlaps: dict[str, dict[str, Any]] = {}
    for row in doc.get("overlap", []):
        name = _check_row("overlap", row, OVERLAP_FRACTIONS + OVERLAP_FLAGS, ("name", "source"), OVERLAP_OPTIONAL_FLAGS)
        for f in OVERLAP_FRACTIONS:
            v = row[f]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
                raise _bad("overlap", name, f, v, "a fraction in [0, 1]")
        for f in (*OVERLAP_FLAGS, *(f for f in OVERLAP_OPTIONAL_FLAGS if f in row)):
            if not isinstance(row[f], bool):
                raise _bad("overlap", name, f, row[f], "true or false")
        if name in overlaps:
            raise ValueError(f"{FILE}: [[overlap]] {name} twice")
        overlaps[name] = row
    kernels: dict[str, dict[str, Any]] = {}
    for row in doc.get("kernel", []):
        figs = tuple(k for k in row if k not in ("name", "kind", "source") and not k.endswith("_source"))
        name = _check_row("kernel", row, figs, ("name", "kind", "source"))
        if row["kind"] not in KERNEL_KINDS:
            raise _bad("kernel", name, "kind", row["kind"], f"one of {', '.join(KERNEL_KINDS)}")
        if "other" not in figs:
            raise _bad("kernel", name, "other", None, "give the fraction for architectures not listed")
        for f in figs:
            v = row[f]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 < v <= 1.0:
                raise _bad("kernel", name, f, v, "a fraction of the peak in (0, 1]")
        if name in kernels:
            raise ValueError(f"{FILE}: [[kernel]] {name} twice")
        kernels[name] = row
    runtimes: dict[str, dict[str, Any]] = {}
    figures = (*RUNTIME_WORDS, *RUNTIME_FLAGS, *RUNTIME_COSTS, *RUNTIME_COUNTS, "attention_kernel")
    for row in doc.get("runtime", []):
        name = _check_row("runtime", row, figures, ("name", "source", "choice", "overlap"))
        ak = row["attention_kernel"]
        if kernels.get(ak, {}).get("kind") != "attention":
            raise _bad("runtime", name, "attention_kernel", ak, "an attention [[kernel]] name")
        if row["overlap"] not in overlaps:
            raise _bad("runtime", name, "overlap", row["overlap"], f"one of {', '.join(overlaps)}")
        for f, words in RUNTIME_WORDS.items():
            if row[f] not in words:
                raise _bad("runtime", name, f, row[f], f"one of {', '.join(words)}")
        for f in (*RUNTIME_FLAGS, "choice"):
            if not isinstance(row[f], bool):
                raise _bad("runtime", name, f, row[f], "true or false")
        for f in RUNTIME_COSTS:
            v = row[f]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v < 1.0:
                raise _bad("runtime", name, f, v, "seconds in [0, 1)")
        for f in RUNTIME_COUNTS:
            if isinstance(row[f], bool) or not isinstance(row[f], int) or row[f] < 1:
                raise _bad("runtime", name, f, row[f], "a positive integer")
        if name in runtimes:
            raise ValueError(f"{FILE}: [[runtime]] {name} twice")
        runtimes[name] = row
    if not overlaps or not runtimes or not any(k["kind"] == "gemm" for k in kernels.values()):
        raise ValueError(f"{FILE}: needs [[overlap]], [[runtime]] and a gemm [[kernel]] row")
    return overlaps, runtimes, kernels


def _load() -> tuple[Rows, Rows, Rows]:
    return parse_table(resources.files("planner.specs").joinpath(FILE).read_text(encoding="utf-8"))


OVERLAP_ROWS, RUNTIME_ROWS, KERNEL_ROWS = _load()


def kernel_fractions(name: str) -> tuple[tuple[tuple[str, float], ...], float]:
    """((architecture, fraction) pairs, the fraction for other architectures) of [[kernel]] `name`."""
    row = KERNEL_ROWS[name]
    pairs = tuple(
        (k, float(v))
        for k, v in row.items()
        if k not in ("name", "kind", "source", "other") and not k.endswith("_source")
    )
    return pairs, float(row["other"])


def figure_source(kind: str, name: str, figure: str) -> str:
    """Where the figure `figure` of row `name` ([[overlap]] or [[runtime]]) comes from."""
    rows = {"overlap": OVERLAP_ROWS, "runtime": RUNTIME_ROWS, "kernel": KERNEL_ROWS}[kind]
    return rows[name][f"{figure}_source"]
