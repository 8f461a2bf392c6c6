"""What to profile and how absent devices are estimated (pure)."""

import pytest

from planner.errors import MeshplanError
from planner.measure.profiles import DEFAULT_EFFICIENCY, LayerProfile, ProfileKey, achieved_efficiency
from planner.measure.targets import (
    comm_fits_from_snapshot,
    device_dtype,
    efficiency_for,
    profile_keys,
    shape_groups,
    validate_shapes,
)
from planner.specs.cluster import parse_cluster_toml
from planner.specs.model import PRESETS

TINY = PRESETS["tiny"]


def _row(kind, train_s, dtype="bf16"):
    return LayerProfile(ProfileKey(kind, "block", 1, 64, 1, False, dtype), train_s / 3, 2 * train_s / 3, 0, 0, 0, False)


def test_grid_has_one_key_per_distinct_shape_and_groups_by_seq_and_tp():
    keys = profile_keys("cpu", [1, 2], [64], [1, 2], "fp32")
    assert len(keys) == 2 * 2 * 3 * 2  # mbs x tp x layer kinds x recompute; independent of num_layers
    assert set(shape_groups(keys)) == {("cpu", 64, 1), ("cpu", 64, 2)}


def test_gpu_measurements_calibrate_gpu_estimates():
    h100 = _row("H100-SXM5-80GB", 1e-6)
    eff, source = efficiency_for(TINY, "A100-SXM4-40GB", [h100], {"H100-SXM5-80GB": 989e12})
    assert eff == pytest.approx(achieved_efficiency(TINY, h100, 989e12)) and "H100" in source


def test_cpu_measurements_do_not_calibrate_gpu_estimates():
    cpu = _row("cpu", 1e-3, "fp32")
    assert efficiency_for(TINY, "A100-SXM4-40GB", [cpu], {"cpu": 50e9}) == (DEFAULT_EFFICIENCY, "default")


def test_gpus_train_in_bf16_and_cpus_in_the_configured_dtype():
    assert device_dtype("T4", "fp32") == "bf16" and device_dtype("cpu", "fp32") == "fp32"


@pytest.mark.parametrize(
    ("mbs", "seq", "tp", "field"),
    [([0], [], [1], "profile.mbs"), ([1], [65], [1], "profile.seq"), ([1], [], [3], "profile.tp")],
)
def test_unbuildable_shapes_are_rejected_with_the_field(mbs, seq, tp, field):
    with pytest.raises(MeshplanError, match=field):
        validate_shapes(TINY, mbs, seq, tp)


def test_comm_fits_use_measured_fits_per_link_class_and_datasheet_for_the_rest():
    cluster = parse_cluster_toml(
        'name = "c"\n[[nodes]]\nname = "a"\ndevice = "A100-SXM4-40GB"\nnum_devices = 2\n'
        'intra_link = "nvlink3"\ninter_link = "ib-hdr"\n'
    )
    fits = comm_fits_from_snapshot(
        cluster,
        [{"op": "all_reduce", "link_class": "intra-node", "alpha_s": 1e-5, "beta_s_per_byte": 1e-11, "r2": 0.99}],
    )
    by = {(f.link_kind, f.op): f for f in fits}
    assert by[("nvlink3", "all_reduce")].measured and by[("nvlink3", "all_reduce")].time_s(1e6) == pytest.approx(2e-5)
    assert not by[("ib-hdr", "send_recv")].measured
    assert by[("ib-hdr", "send_recv")].beta_s_per_byte == pytest.approx(1 / 25e9)
