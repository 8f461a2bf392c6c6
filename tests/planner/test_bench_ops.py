"""Benchmark operation names: one `BenchOp` enum for the ranks that write them and the calibration that reads them."""

from __future__ import annotations

import ast
from pathlib import Path

from planner.measure.calibrate import collective_fits, measured_slowdowns
from planner.measure.discovery import fit_snapshot
from planner.measure.ops import COLLECTIVE_OPS, OVERHEAD_OPS, BenchOp

ROOT = Path(__file__).resolve().parents[2]

# the values DuckDB already holds (hardware_measurements.op, hardware_fits.op): renaming one strands old rows
STORED = {
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "send_recv",
    "pipeline_microbatch",
    "fsdp_module",
    "fsdp_tensor",
    "compute_alone",
    "compute_free",
    "compute_lockstep",
}


def test_stored_names_are_unchanged():
    assert {op.value for op in BenchOp} == STORED


def test_rows_read_back_as_plain_strings_are_matched():
    rows = [
        {"op": "all_reduce", "link_class": "intra-node", "message_bytes": b, "time_s": 1e-5 + b * 1e-9}
        for b in (1 << 10, 1 << 20)
    ] + [{"op": "compute_free", "link_class": "intra-node", "message_bytes": 0, "time_s": 2.0}]
    (fit,) = fit_snapshot({"measurements": rows})  # the overhead row is not α–β fitted
    assert fit.op == BenchOp.ALL_REDUCE
    fits = collective_fits(
        [{"op": "all_reduce", "link_class": "intra-node", "alpha_s": 1e-5, "beta_s_per_byte": 1e-9}], 2
    )
    assert BenchOp.ALL_REDUCE in fits and set(fits) <= set(COLLECTIVE_OPS)
    rows.append({"op": "compute_alone", "message_bytes": 0, "time_s": 1.0})
    assert measured_slowdowns(rows) == (2.0, 1.0)
    assert BenchOp.COMPUTE_FREE in OVERHEAD_OPS


def test_no_op_name_is_spelt_out_where_ops_are_written_or_read():
    """Producers (worker/) and consumers (planner/) name ops through BenchOp, never as string literals."""
    names = {op.value for op in BenchOp}
    found = []
    for path in [*(ROOT / "worker").rglob("*.py"), *(ROOT / "planner").rglob("*.py")]:
        if path.name == "ops.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not found, found
