"""Specs and validators: GPU catalog, models, clusters, config — bad input gives a clear error."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import MeshplanError, UnknownNameError
from planner.specs.catalog import CATALOG, lookup
from planner.specs.cluster import parse_cluster, parse_cluster_toml
from planner.specs.config import load_config
from planner.specs.model import PRESETS, ModelSpec, get_model
from planner.specs.topology import device_graph, link_between
from planner.validation import parse

REQUIRED_GPUS = [
    "V100-SXM2-16GB",
    "V100-SXM2-32GB",
    "A100-SXM4-40GB",
    "A100-SXM4-80GB",
    "A100-PCIe-40GB",
    "A100-PCIe-80GB",
    "H100-SXM5-80GB",
    "H100-PCIe-80GB",
    "H200-SXM-141GB",
    "A10",
    "A10G",
    "L4",
    "L40S",
    "T4",
    "A40",
    "RTX-3090",
    "RTX-4090",
    "MI250X",
    "MI300X",
]


def test_catalog_has_every_required_gpu_with_a_source():
    for name in REQUIRED_GPUS:
        g = CATALOG[name]
        assert g.source and g.source_url.startswith("https://")
        assert g.memory_bytes > 8 * 2**30 and g.peak_fp32_flop_per_s > 1e12


def test_catalog_numbers_match_datasheets():
    assert lookup("A100-SXM4-80GB").peak_flop_per_s("bf16") == 312e12
    assert lookup("H100-SXM5-80GB").peak_flop_per_s("bf16") == 989e12
    assert lookup("A100-SXM4-80GB").memory_bytes == 80 * 2**30
    # V100 and T4 have no bf16: training runs fp16 tensor cores
    assert lookup("V100-SXM2-32GB").peak_flop_per_s("bf16") == 125e12
    assert lookup("T4").peak_flop_per_s("bf16") == 65e12


def test_catalog_accepts_names_torch_reports():
    assert lookup("NVIDIA A100-SXM4-80GB").name == "A100-SXM4-80GB"
    assert lookup("NVIDIA H100 80GB HBM3").name == "H100-SXM5-80GB"
    assert lookup("Tesla T4").name == "T4"


def test_unknown_gpu_suggests_closest_names():
    with pytest.raises(UnknownNameError) as e:
        lookup("A100-80GB")
    assert "A100-SXM4-80GB" in str(e.value) and e.value.field == "gpu"


def test_presets_have_published_parameter_counts():
    # untied heads (meshplan's runtime), so GPT counts include a second vocab×h matrix
    assert abs(get_model("gpt3-175b").num_params() / 1e9 - 175.8) < 1.0
    assert abs(get_model("llama3-8b").num_params() / 1e9 - 8.03) < 0.05
    assert abs(get_model("llama3-70b").num_params() / 1e9 - 70.6) < 0.2
    assert abs(get_model("llama3-405b").num_params() / 1e9 - 405.8) < 1.0
    for name in [
        "gpt2-small",
        "gpt2-medium",
        "gpt2-large",
        "gpt2-xl",
        "gpt3-1.3b",
        "gpt3-2.7b",
        "gpt3-6.7b",
        "gpt3-13b",
    ]:
        assert name in PRESETS


def test_unknown_model_suggests_presets():
    with pytest.raises(UnknownNameError, match="gpt3-175b"):
        get_model("gpt3-175")


def test_model_rejects_heads_not_dividing_hidden():
    with pytest.raises(MeshplanError, match="num_heads"):
        parse(ModelSpec, {"num_layers": 2, "hidden": 100, "num_heads": 3, "vocab_size": 10, "seq_len": 8})


def test_model_fingerprint_ignores_name_and_tracks_dimensions():
    a = get_model("gpt2-small")
    assert a.fingerprint() == a.model_copy(update={"name": "x"}).fingerprint()
    assert a.fingerprint() != a.model_copy(update={"seq_len": 2048}).fingerprint()


def test_example_clusters_parse(tmp_path):
    from pathlib import Path

    files = sorted(Path("examples/clusters").glob("*.toml"))
    assert len(files) >= 3
    counts = {f.stem: parse_cluster_toml(f.read_text(), str(f)).num_devices for f in files}
    assert counts["a100-8x8-ib200"] == 64
    assert counts["mixed-a100-v100-t4"] == 16
    assert counts["h100-a100-1024"] == 1024


def test_bad_cluster_file_names_field_and_fix():
    bad = 'name = "x"\n[[nodes]]\nname = "a"\ndevice = "A100-SXM4-80GB"\nnum_devices = 8\nintra_link = "nvlink3"\n'
    with pytest.raises(MeshplanError) as e:
        parse_cluster_toml(bad, "c.toml")
    assert "inter_link" in str(e.value) and "required" in str(e.value)
    with pytest.raises(MeshplanError, match="not valid TOML"):
        parse_cluster_toml("name = ", "c.toml")
    with pytest.raises(MeshplanError, match="did you mean"):
        parse_cluster_toml(bad + 'inter_link = "infiniband"\n', "c.toml")


def test_cpu_nodes_need_measured_figures():
    node = {"name": "n", "device": "cpu", "num_devices": 2, "intra_link": "pcie3", "inter_link": "eth-10g"}
    with pytest.raises(MeshplanError, match="meshplan discover"):
        parse_cluster({"name": "c", "nodes": [node]})


def test_device_graph_links():
    c = parse_cluster_toml(open("examples/clusters/a100-8x8-ib200.toml").read())
    g = device_graph(c)
    assert g.number_of_nodes() == 64 + 8 + 1
    assert link_between(g, 0, 7).kind == "nvlink3"
    cross = link_between(g, 0, 8)
    assert cross.kind == "ib-hdr" and cross.bandwidth_bytes_per_s == 25e9


def test_device_ids_are_node_major_and_unique():
    c = parse_cluster_toml(open("examples/clusters/mixed-a100-v100-t4.toml").read())
    devs = c.devices()
    assert [d.id for d in devs] == list(range(16))
    assert [d.kind for d in devs[:5]] == ["A100-SXM4-40GB"] * 4 + ["V100-SXM2-32GB"]
    assert devs[-1].node == 3 and devs[-1].local == 3


def test_config_overrides_and_errors():
    cfg = load_config("[search]\ntop_k = 3\n", ["search.global_batch=64", "profile.mbs=[1,2]", "model=gpt2-small"])
    assert cfg.search.top_k == 3 and cfg.search.global_batch == 64 and cfg.profile.mbs == (1, 2)
    assert cfg.model == "gpt2-small"
    with pytest.raises(MeshplanError, match="search.top_kk"):
        load_config(None, ["search.top_kk=3"])
    with pytest.raises(MeshplanError, match="section.key=value"):
        load_config(None, ["oops"])
    with pytest.raises(MeshplanError, match="search.global_batch"):
        load_config(None, ["search.global_batch=-1"])


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["name", "nodes", "extra"]),
        st.one_of(
            st.text(max_size=5),
            st.integers(-3, 3),
            st.lists(
                st.dictionaries(
                    st.sampled_from(["name", "device", "num_devices", "count", "intra_link", "inter_link"]),
                    st.one_of(
                        st.text(max_size=8), st.integers(-2, 9), st.sampled_from(["T4", "nvlink3", "ib-hdr", "cpu"])
                    ),
                ),
                max_size=3,
            ),
        ),
    )
)
def test_fuzzed_cluster_input_is_valid_or_a_clear_error(data):
    try:
        parse_cluster(data)
    except MeshplanError as e:
        assert e.field and e.fix


def test_issue14_devices_are_in_the_catalog_with_sources():
    from planner.specs.cluster import parse_cluster

    for name, tflops, gib in [
        ("GH200-96GB", 989, 96),
        ("H100-NVL-94GB", 835, 94),
        ("H100-HBM2e-96GB-500W", 835, 96),
        ("RTX-2080-Ti", 53.8, 11),
        ("Titan-RTX", 130, 24),
    ]:
        g = lookup(name)
        assert g.peak_flop_per_s("bf16") == pytest.approx(tflops * 1e12)
        assert g.memory_bytes == gib * 2**30 and g.source and g.source_url
    assert lookup("NVIDIA GeForce RTX 2080 Ti").name == "RTX-2080-Ti"
    node = {"name": "n", "device": "Titan-RTX", "num_devices": 2, "intra_link": "pcie3", "inter_link": "eth-10g"}
    assert parse_cluster({"name": "c", "nodes": [node]}).nodes[0].memory_bytes == 24 * 2**30


def test_a_device_the_catalog_lacks_can_be_defined_inline():
    from planner.cost import estimate
    from planner.specs.cluster import parse_cluster
    from planner.specs.model import get_model
    from planner.specs.plan import Plan, StagePlan

    node = {"name": "n", "device": "OEM-H100-64GB", "num_devices": 2, "intra_link": "nvlink4", "inter_link": "ib-ndr"}
    with pytest.raises(MeshplanError, match="define it inline"):
        parse_cluster({"name": "c", "nodes": [node]})
    figures = {
        "device_memory_bytes": 64 * 2**30,
        "device_peak_flop_per_s": 900e12,
        "device_memory_bandwidth_bytes_per_s": 3e12,
    }
    c = parse_cluster({"name": "c", "nodes": [node | figures]})
    n = c.nodes[0]
    assert (n.gpu, n.device_kind, n.memory_bytes) == (None, "OEM-H100-64GB", 64 * 2**30)
    assert n.peak_flop_per_s("bf16") == 900e12 and n.memory_bandwidth_bytes_per_s == 3e12
    plan = Plan(
        model="gpt2-small",
        cluster="c",
        global_batch_size=8,
        seq_len=1024,
        micro_batch_size=4,
        stages=(StagePlan(layer_start=0, layer_end=12, device_ids=(0, 1), dp=2),),
        batch_shares=(4, 4),
    )
    cost = estimate(plan, get_model("gpt2-small"), c)
    assert cost.feasible and cost.step_time_s > 0
