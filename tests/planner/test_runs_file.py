"""A measured-runs CSV (the development set's columns): good rows become cases; a bad row is named."""

import pytest

from planner.errors import MeshplanError
from planner.measure.runs_file import parse_runs, read_runs

HEAD = "run_id,layers,hidden,heads,seq_len,vocab,global_batch,micro_batch,tp,pp,dp,gpu,num_gpus,gpus_per_node,iteration_time_s"
ROW = "r1,24,1024,16,1024,50304,32,2,1,2,8,A100-SXM4-80GB,16,8,1.25"


def test_a_row_becomes_the_plan_that_ran():
    (run,) = parse_runs(f"{HEAD}\n{ROW}\n")
    assert (run.run_id, run.device_kind, run.measured_s) == ("r1", "A100-SXM4-80GB", 1.25)
    assert (run.plan.pp, run.plan.dp, run.plan.num_microbatches()) == (2, 8, 2)
    assert run.cluster.num_devices == 16 and run.model.ffn == 4096


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (HEAD.replace(",heads", "") + "\n" + ROW, r"runs file columns.*heads.*missing"),
        (f"{HEAD}\n{ROW}\n{ROW.replace(',1.25', ',0')}", r"runs file row 3, iteration_time_s.*'0'.*positive"),
        (f"{HEAD}\n{ROW.replace('A100-SXM4-80GB', 'A100-XXL')}", r"runs file row 2, gpu.*A100-XXL.*catalog"),
        (f"{HEAD}\n{ROW.replace(',8,1.25', ',8,-1')}", r"row 2, iteration_time_s"),
        (f"{HEAD}\n{ROW.replace('1,2,8,', '1,2,4,')}", r"row 2, dp.*num_gpus=16"),
    ],
)
def test_a_bad_file_names_the_row_and_the_field(text, match):
    with pytest.raises(MeshplanError, match=match) as err:
        parse_runs(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("gpu", "link"),
    [
        ("GH200-96GB", "nvlink4"),  # NVLink by the catalog's fabric, not an "SXM" in the name
        ("A100-SXM4-80GB", "nvlink3"),
        ("H100-NVL-94GB", "pcie5"),  # a 2-GPU bridge does not join a node
        ("T4", "pcie3"),
        ("A100-PCIe-80GB", "pcie4"),
    ],
)
def test_the_intra_node_link_comes_from_the_catalog(gpu, link):
    (run,) = parse_runs(f"{HEAD}\n{ROW.replace('A100-SXM4-80GB', gpu).replace(',1.25', ',60')}\n")
    assert run.cluster.nodes[0].intra_link.kind == link


def test_rows_without_a_time_are_skipped_and_an_impossible_throughput_is_a_bad_row():
    got = read_runs(f"{HEAD}\n{ROW}\n{ROW.replace(',1.25', ',')}\n")
    assert len(got.runs) == 1 and got.skipped == [(3, "r1", "no measured time")]
    assert got.skipped_note() == "skipped 1 rows without iteration_time_s or tokens_per_sec: 3 (r1)"
    with pytest.raises(MeshplanError, match=r"row 2, iteration_time_s.*1e-30.*implies MFU .* > 1"):
        read_runs(f"{HEAD}\n{ROW.replace(',1.25', ',1e-30')}\n")
