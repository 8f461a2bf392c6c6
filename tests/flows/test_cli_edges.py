"""Plan files at the CLI edge: strict types, exports the runtime would refuse, comparisons of
different work — each one line naming the file and field, exit 1 (in-process, cli.main.run_cli)."""

import json

import pytest

from tests.support.fuzz_cli import PLAN_V1, Files, outcome

MIXED = "examples/clusters/mixed-a100-v100-t4.toml"
# gpt3-13b has 40 heads: tp 3 divides neither them nor its kv heads
TP3_ON_40_HEADS = {
    **PLAN_V1,
    "model": "gpt3-13b",
    "seq_len": 2048,
    "micro_batch_size": 1,
    "stages": [{"layer_start": 0, "layer_end": 40, "device_ids": [0, 1, 2], "tp": 3, "dp": 1}],
    "batch_shares": [8],
}


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    return Files(tmp_path)


def _write(files, name, doc):
    path = files.root / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_number_written_as_a_string_in_a_plan_file_is_refused(files):
    doc = json.loads(json.dumps(PLAN_V1))
    doc["stages"][0]["tp"] = "1"
    kind, line = outcome(["export", _write(files, "str.json", doc)], files)
    assert kind == "error" and "str.json: stages.0.tp='1'" in line and "JSON integer" in line, line


def test_export_refuses_a_plan_the_runtime_refuses(files):
    kind, line = outcome(["export", _write(files, "tp3.json", TP3_ON_40_HEADS), "--format", "torchtitan"], files)
    assert kind == "error" and "stages[0].tp=3" in line and "heads=40" in line, line
    ok, text = outcome(["export", str(files.root / "plan_ok.json"), "--format", "torchtitan"], files)
    assert ok == "ok" and "[activation_checkpoint]" in text


def test_compare_refuses_plans_of_different_models_or_batches(files):
    a = str(files.root / "plan_ok.json")
    kind, line = outcome(["compare", a, _write(files, "b.json", TP3_ON_40_HEADS), "--cluster", MIXED], files)
    assert kind == "error" and "b.json: model='gpt3-13b'" in line and "same model" in line, line
    bigger = {**PLAN_V1, "global_batch_size": 16, "batch_shares": [8, 8]}
    kind, line = outcome(["compare", a, _write(files, "c.json", bigger), "--cluster", MIXED], files)
    assert kind == "error" and "c.json: global_batch_size=16" in line, line
    kind, _ = outcome(["compare", a, a, "--cluster", MIXED], files)
    assert kind == "ok"
