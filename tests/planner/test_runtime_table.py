"""The runtime table is data (planner/specs/data/runtimes.toml): every figure sourced, every row whole
and sane, and the values the cost model prices with are the table's."""

from importlib import resources

import pytest

from planner.cost import overlap, runtimes
from planner.cost.runtime_table import OVERLAP_ROWS, RUNTIME_ROWS, figure_source, parse_table

TEXT = resources.files("planner.specs").joinpath("data/runtimes.toml").read_text(encoding="utf-8")


def test_every_figure_has_a_source_and_the_priced_values_are_the_tables():
    for name, row in RUNTIME_ROWS.items():
        p = runtimes.profile_named(name)
        assert (p.launch_s, p.kernels_per_block, p.microbatch_s) == (
            row["launch_s"],
            row["kernels_per_block"],
            row["microbatch_s"],
        )
        assert p.overlap is overlap.RUNTIMES[row["overlap"]]
        assert figure_source("runtime", name, "launch_s").strip()
    for name, row in OVERLAP_ROWS.items():
        assert overlap.RUNTIMES[name].gather_overlap == row["gather_overlap"]
        assert all(row[f"{k}_source"].strip() for k in ("tp_overlap", "overlaps_on_cpu"))
    # the user's choices, and the published-rows-only runtime priced but not offered
    assert set(runtimes.PROFILES) == {n for n, r in RUNTIME_ROWS.items() if r["choice"]}
    assert runtimes.profile_named("megatron-sc21").name == "megatron-sc21"
    # derived kernels: the runtime's attention family, the cuBLAS GEMM fraction, none fitted
    assert runtimes.profile_named("composer").kernels.flash_fraction("Hopper") == 0.19
    assert runtimes.profile_named("megatron").kernels.flash_fraction("Ampere") == 0.6
    assert runtimes.profile_named("meshplan").kernels.gemm_fraction("Hopper") == 0.8


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        (
            'launch_s_source = "eager PyTorch',
            'launch_x = "eager PyTorch',
            r"\[\[runtime\]\] meshplan: missing \['launch_s_source'\], unknown \['launch_x'\]",
        ),
        ("gather_overlap = 1.0", "gather_overlap = 1.5", r"\[\[overlap\]\] meshplan: gather_overlap = 1.5, a fraction"),
        ("Hopper = 0.75", "Hopper = 1.5", r"\[\[kernel\]\] fa3: Hopper = 1.5, a fraction of the peak"),
        ('attention_kernel = "triton-flash"', 'attention_kernel = "cublas"', r"composer: attention_kernel = 'cublas'"),
        ('overlap = "fsdp-composer"', 'overlap = "fsdp"', r"\[\[runtime\]\] composer: overlap = 'fsdp', one of"),
        ("microbatch_s = 0.0", "microbatch_s = -0.01", r"\[\[runtime\]\] meshplan: microbatch_s = -0.01, seconds"),
        (
            'tp_overlap_source = "DTensor parallelize_module: TP all-reduces are waited on before the next op"',
            'tp_overlap_source = " "',
            r"\[\[overlap\]\] meshplan: tp_overlap needs a source string",
        ),
        # an optional flag may be left out, but where given it is a boolean with its source
        (
            "grad_allreduce_fp32 = true",
            "grad_allreduce_fp32 = 1",
            r"deepspeed-amp: grad_allreduce_fp32 = 1, true or false",
        ),
        (
            "grad_allreduce_fp32_source = ",
            "grad_allreduce_fp32_src = ",
            r"deepspeed-amp: missing \['grad_allreduce_fp32_source'\]",
        ),
    ],
)
def test_a_bad_table_is_refused_naming_the_row_and_the_figure(old, new, match):
    assert old in TEXT
    with pytest.raises(ValueError, match=match):
        parse_table(TEXT.replace(old, new, 1))


def test_an_optional_flag_left_out_is_false_and_the_amp_row_states_fp32_gradient_allreduce():
    assert overlap.RUNTIMES["deepspeed-amp"].grad_allreduce_fp32 is True
    assert "fp32_allreduce" in figure_source("overlap", "deepspeed-amp", "grad_allreduce_fp32")
    assert not any(rt.grad_allreduce_fp32 for name, rt in overlap.RUNTIMES.items() if name != "deepspeed-amp")
    assert "grad_allreduce_fp32" not in OVERLAP_ROWS["megatron-sc21"]
    # published rows only: priced, not a user's choice
    assert runtimes.profile_named("deepspeed-amp").overlap.name == "deepspeed-amp"
    assert "deepspeed-amp" not in runtimes.RUNTIME_NAMES
