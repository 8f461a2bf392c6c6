"""Train a Hugging Face model on the user's own data, end to end on real components (issue #38).

A tiny random Llama (GQA, untied) and a tiny GPT-2 made with `transformers` and saved with
`save_pretrained`; a byte-level BPE tokenizer trained with `tokenizers` on the shipped corpus;
`meshplan data prepare` on JSONL and Parquet; `meshplan train --model hf:DIR --init hf:DIR --data DIR`
on torchrun ranks (pp2 and dp2), with validation into DuckDB. No network.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from planner.specs.plan import parse_plan
from storage.db import query
from tests.support.cli import meshplan_main as _main
from worker.data import batch_rows

pytestmark = [pytest.mark.dist, pytest.mark.flow]
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
VOCAB, SEQ, BATCH = 384, 32, 4
# fp32 on CPU: meshplan's blocks and transformers' run the same arithmetic in another order
# (interleaved vs half-split RoPE rows, fused vs split GPT-2 projections): ~1e-6 apart.
LOSS_ATOL = 1e-4
LOGITS_ATOL = 1e-4


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    """Tokenizer, documents as JSONL and Parquet, a Llama and a GPT-2 folder."""
    import polars as pl
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("hf")
    docs = [line for line in (ROOT / "worker/data/corpus.txt").read_text().splitlines() if line.strip()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(docs, trainer)
    (d / "tok").mkdir()
    tok.save(str(d / "tok" / "tokenizer.json"))
    with (d / "docs.jsonl").open("w") as f:
        for doc in docs:
            f.write(json.dumps({"body": doc}) + "\n")
    pl.DataFrame({"body": docs}).write_parquet(d / "docs.parquet")
    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        )
    )
    llama.save_pretrained(d / "llama")
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0
        )
    )
    gpt2.save_pretrained(d / "gpt2")
    return {"dir": d, "tok": d / "tok", "jsonl": d / "docs.jsonl", "parquet": d / "docs.parquet", "docs": docs}  # type: ignore[dict-item]


def _plan(tmp: Path, name: str, model: str, stages: list[dict], shares: list[int], mbs: int) -> Path:
    plan = parse_plan(
        {
            "model": model,
            "cluster": "cpu",
            "global_batch_size": BATCH,
            "seq_len": SEQ,
            "micro_batch_size": mbs,
            "schedule": "1f1b",
            "dtype": "fp32",
            "batch_shares": shares,
            "stages": stages,
        }
    )
    path = tmp / name
    path.write_text(plan.to_json())
    return path


def _hf_loss(folder: Path, data: Path, step: int) -> float:
    """transformers' own loss on global batch `step` of the prepared data (the batch every layout reads)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    x, y = batch_rows(str(data), step, range(BATCH), BATCH, SEQ, VOCAB)
    with torch.no_grad():
        logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).item()


def test_data_prepare_jsonl_and_parquet_give_the_same_tokens_counted_as_the_tokenizer_does(
    assets, tmp_path, monkeypatch, capsys
):
    state = tmp_path / "state"
    outs = []
    for kind in ("jsonl", "parquet"):
        out = tmp_path / f"ds-{kind}"
        rc, stdout, err = _main(
            monkeypatch, capsys, "--state-dir", str(state), "data", "prepare", "--input", str(assets[kind]),
            "--tokenizer", str(assets["tok"]), "--out", str(out), "--text-field", "body", "--val-fraction", "0.05",
        )  # fmt: skip
        assert rc == 0, err
        outs.append(out)
    for split in ("train", "val"):
        assert (outs[0] / f"{split}.bin").read_bytes() == (outs[1] / f"{split}.bin").read_bytes()
        assert (outs[0] / f"{split}.idx").read_bytes() == (outs[1] / f"{split}.idx").read_bytes()
    manifest = json.loads((outs[0] / "manifest.json").read_text())
    tok = tokenizers.Tokenizer.from_file(str(assets["tok"] / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    lengths = [len(e.ids) + 1 for e in tok.encode_batch(assets["docs"], add_special_tokens=False)]
    n_val = int(len(lengths) * 0.05)
    assert manifest["eos_id"] == eos and manifest["dtype"] == "uint16"
    assert manifest["val"]["documents"] == n_val and manifest["train"]["documents"] == len(lengths) - n_val
    assert manifest["train"]["tokens"] + manifest["val"]["tokens"] == sum(lengths)
    train = np.fromfile(outs[0] / "train.bin", dtype=np.uint16)
    starts = np.fromfile(outs[0] / "train.idx", dtype=np.int64)
    assert train.size == manifest["train"]["tokens"] and (train[starts[1:] - 1] == eos).all()  # a document ends each
    assert train[: lengths[0] - 1].tolist() == tok.encode(assets["docs"][0], add_special_tokens=False).ids


@pytest.fixture(scope="module")
def dataset(assets, tmp_path_factory) -> Path:
    from storage.dataset import prepare

    out = tmp_path_factory.mktemp("data") / "ds"
    prepare([assets["jsonl"]], assets["tok"], out, val_fraction=0.05, text_field="body")
    return out


@pytest.mark.parametrize(
    "arch,plan_args",
    [
        ("llama", (
            [{"layer_start": 0, "layer_end": 2, "device_ids": [0]}, {"layer_start": 2, "layer_end": 4, "device_ids": [1]}],
            [4], 2,
        )),
        ("gpt2", ([{"layer_start": 0, "layer_end": 2, "device_ids": [0, 1], "dp": 2}], [2, 2], 2)),
        ("llama", ([{"layer_start": 0, "layer_end": 4, "device_ids": [0, 1], "tp": 2}], [4], 2)),
    ],
    ids=["llama-pp2", "gpt2-dp2", "llama-tp2"],
)  # fmt: skip
def test_hf_weights_train_on_prepared_data_and_export_back(
    arch, plan_args, assets, dataset, tmp_path, monkeypatch, capsys
):
    folder = assets["dir"] / arch
    plan = _plan(tmp_path, "plan.json", arch, *plan_args)
    state = tmp_path / "state"
    run_id = f"hf-{arch}"
    rc, out, err = _main(
        monkeypatch, capsys, "--state-dir", str(state), "train", "--plan", str(plan), "--model", f"hf:{folder}",
        "--init", f"hf:{folder}", "--data", str(dataset), "--steps", "20", "--lr", "0.003", "--checkpoint-every", "0",
        "--eval-every", "10", "--eval-batches", "2", "--run-id", run_id, "--no-replan",
    )  # fmt: skip
    assert rc == 0, out + err
    db = str(state / "meshplan.duckdb")
    losses = query(
        db, f"SELECT step, loss FROM step_metrics WHERE run_id = '{run_id}' AND loss IS NOT NULL ORDER BY step"
    )
    by_step: dict[int, list[float]] = {}
    for step, loss in losses.iter_rows():
        by_step.setdefault(step, []).append(loss)
    first = sum(by_step[0]) / len(by_step[0])  # dp2, equal shares: the replicas' means average to the batch's
    assert abs(first - _hf_loss(folder, dataset, 0)) < LOSS_ATOL
    last = sum(by_step[19]) / len(by_step[19])
    assert last < first - 0.1, f"20 steps must lower the loss: {first:.4f} -> {last:.4f}"
    evals = query(db, f"SELECT step, val_loss, num_batches FROM eval_metrics WHERE run_id = '{run_id}' ORDER BY step")
    assert evals["step"].to_list() == [10, 20] and evals["num_batches"].to_list() == [2, 2]
    assert all(np.isfinite(evals["val_loss"].to_list()))
    assert "val_loss" in out

    # weights out: the run's final checkpoint, saved in this layout, as a folder transformers loads
    exported = tmp_path / "exported"
    rc, out, err = _main(
        monkeypatch, capsys, "--state-dir", str(state), "export-weights", "--run", run_id, "--out", str(exported)
    )
    assert rc == 0, out + err
    assert (exported / "tokenizer.json").read_bytes() == (dataset / "tokenizer.json").read_bytes()
    from planner.specs.model import ModelSpec
    from worker.checkpoint import load_full_model_state
    from worker.model import Decoder

    spec = ModelSpec.model_validate_json((state / "runs" / run_id / "model.json").read_text())
    ours = Decoder(spec).eval()
    ours.load_state_dict(load_full_model_state(state / "runs" / run_id / "checkpoints" / "step_00000020", spec))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    x, _ = batch_rows(str(dataset), 3, range(BATCH), BATCH, SEQ, VOCAB, split="val")
    with torch.no_grad():
        diff = (theirs(input_ids=x).logits - ours(x)[..., :VOCAB]).abs().max().item()
    assert diff < LOGITS_ATOL, diff
    trained = {k: v for k, v in theirs.state_dict().items()}
    initial = transformers.AutoModelForCausalLM.from_pretrained(folder).state_dict()
    assert any(not torch.equal(trained[k], initial[k]) for k in trained if k in initial)  # it is the trained model


def test_bad_hf_inputs_are_one_line_and_write_nothing(assets, dataset, tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file, save_file

    state = tmp_path / "state"
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    rc, _, err = _main(monkeypatch, capsys, "--state-dir", str(state), "plan", "--model", f"hf:{bert}")
    assert rc == 1 and "LlamaForCausalLM" in err and "GPT2LMHeadModel" in err and len(err.strip().splitlines()) == 1

    # a tensor missing from a copy of the Llama folder
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((assets["dir"] / "llama" / "config.json").read_text())
    tensors = load_file(str(assets["dir"] / "llama" / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    plan = _plan(tmp_path, "plan.json", "llama", [{"layer_start": 0, "layer_end": 4, "device_ids": [0]}], [4], 4)
    base = ["--state-dir", str(state), "train", "--plan", str(plan), "--model", f"hf:{assets['dir'] / 'llama'}"]
    rc, _, err = _main(monkeypatch, capsys, *base, "--init", f"hf:{broken}", "--run-id", "bad1")
    assert rc == 1 and "model.layers.1.mlp.up_proj.weight" in err and len(err.strip().splitlines()) == 1

    # a data folder without its manifest
    rc, _, err = _main(monkeypatch, capsys, *base, "--data", str(tmp_path), "--run-id", "bad2")
    assert rc == 1 and "manifest.json" in err and len(err.strip().splitlines()) == 1

    # a tokenizer larger than the model's vocabulary (the `tiny` preset has 256 ids)
    tiny = _plan(tmp_path, "tiny.json", "tiny", [{"layer_start": 0, "layer_end": 4, "device_ids": [0]}], [4], 4)
    rc, _, err = _main(
        monkeypatch, capsys, "--state-dir", str(state), "train", "--plan", str(tiny), "--data", str(dataset),
        "--run-id", "bad3",
    )  # fmt: skip
    assert rc == 1 and "--data" in err and "384" in err and len(err.strip().splitlines()) == 1

    # an empty input
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    rc, _, err = _main(
        monkeypatch, capsys, "--state-dir", str(state), "data", "prepare", "--input", str(empty), "--tokenizer",
        str(assets["tok"]), "--out", str(tmp_path / "never"),
    )  # fmt: skip
    assert rc == 1 and "no documents" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "never").exists()
    assert not list(tmp_path.glob(".never.*"))  # no staging folder left
    runs = state / "runs"
    assert not any((runs / r).exists() for r in ("bad1", "bad2", "bad3"))
