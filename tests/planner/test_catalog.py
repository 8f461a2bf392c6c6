"""The GPU catalog is data (planner/specs/data/gpus.toml): every row whole, sourced and physically sane."""

import tomllib
from importlib import resources

import pytest
from pydantic import ValidationError

from planner.specs.catalog import CATALOG, GB, GIB, TFLOP, _Row


def _rows() -> list[dict]:
    text = resources.files("planner.specs").joinpath("data/gpus.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)["gpu"]


def test_every_row_of_the_file_is_in_the_catalog_once():
    names = [row["name"] for row in _rows()]
    assert len(names) == len(set(names)) == len(CATALOG) >= 26
    assert names == list(CATALOG)


def test_every_figure_has_a_source():
    for row in _rows():
        assert row["source"].strip() and row["source_url"].startswith("https://"), row["name"]
        assert ("num_sms" in row) == ("num_sms_source" in row), row["name"]
        assert ("peak_fp8_tflop_per_s" in row) == ("peak_fp8_source" in row), row["name"]


def test_figures_are_physically_sane():
    for g in CATALOG.values():
        # Tensor-core rates sit above plain fp32; fp8 above fp16; bf16 is fp16's peer where present.
        assert g.peak_fp16_flop_per_s >= g.peak_fp32_flop_per_s, g.name
        assert g.peak_bf16_flop_per_s is None or g.peak_bf16_flop_per_s >= g.peak_fp32_flop_per_s, g.name
        assert g.peak_fp8_flop_per_s is None or g.peak_fp8_flop_per_s >= g.peak_fp16_flop_per_s, g.name
        # Units: a datasheet in TFLOP/s or GB/s that slipped in unscaled (or scaled twice) fails these.
        assert 8 * GB <= g.memory_bytes <= 512 * GB, g.name
        assert 200 * GB <= g.memory_bandwidth_bytes_per_s <= 10_000 * GB, g.name
        assert 5 * TFLOP <= g.peak_fp32_flop_per_s <= 200 * TFLOP, g.name
        assert g.peak_flop_per_s("bf16") <= 3_000 * TFLOP, g.name
        assert g.fabric_bytes_per_s is None or 10 * GB <= g.fabric_bytes_per_s <= 1_000 * GB, g.name
        assert g.num_sms is None or 20 <= g.num_sms <= 304, g.name


def test_known_rows_convert_units():
    a100 = CATALOG["A100-SXM4-80GB"]
    assert a100.memory_bytes == 80 * GIB  # HBM "80 GB" is GiB-sized
    assert a100.peak_bf16_flop_per_s == 312 * TFLOP and a100.peak_fp32_flop_per_s == 19.5 * TFLOP
    assert a100.memory_bandwidth_bytes_per_s == 2039 * GB and a100.fabric_bytes_per_s == 300 * GB
    assert CATALOG["H200-SXM-141GB"].memory_bytes == 141 * GB  # decimal size: memory_gb
    v100 = CATALOG["V100-SXM2-16GB"]
    assert v100.peak_bf16_flop_per_s is None and v100.peak_flop_per_s("bf16") == 125 * TFLOP
    assert CATALOG["H100-SXM5-80GB"].peak_fp8_flop_per_s == 1979 * TFLOP and v100.peak_fp8_flop_per_s is None


@pytest.mark.parametrize(
    "change, field",
    [
        ({"source": ""}, "source"),
        ({"source_url": "www.example.com"}, "source_url"),
        ({"memory_gb": 80}, "memory_gib, memory_gb"),
        ({"num_sms_source": None}, "num_sms"),
        ({"peak_fp8_tflop_per_s": 100}, "peak_fp8_source"),
        ({"peak_fp16_tfops": 1}, "peak_fp16_tfops"),
    ],
)
def test_a_malformed_row_is_refused_naming_its_field(change, field):
    row = next(r for r in _rows() if r["name"] == "A100-SXM4-80GB") | change
    row = {k: v for k, v in row.items() if v is not None}
    with pytest.raises(ValidationError, match=field):
        _Row.model_validate(row)
