"""Tokenization throughput of `meshplan data prepare` (storage/dataset.py) on this machine.

The shipped corpus repeated to `--mb` MiB of JSONL (a document per line), a byte-level BPE tokenizer
of `--vocab` ids trained on the corpus with `tokenizers`, then `prepare` with 1 and 2 worker
processes (and more with `--workers`), each timed whole (reading, encoding, packing, hashing,
writing) and as CPU time of this process; the 1-process run is the baseline of the ratio column.
The token files of every run are checked identical.

    PYTHONPATH=. python bench/data_prepare.py [--mb 8] [--vocab 8192] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from storage.dataset import prepare

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=8.0)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs = [d for d in (ROOT / "worker/data/corpus.txt").read_text().splitlines() if d.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=args.vocab,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(docs, trainer)
        tok.save(str(t / "tokenizer.json"))
        size, n = 0, 0
        with (t / "docs.jsonl").open("w") as f:
            while size < args.mb * (1 << 20):
                line = json.dumps({"text": docs[n % len(docs)]}) + "\n"
                f.write(line)
                size, n = size + len(line), n + 1
        rows, base, first = [], None, None
        for w in args.workers:
            out = t / f"ds{w}"
            c0, t0 = time.process_time(), time.perf_counter()
            m = prepare([t / "docs.jsonl"], t / "tokenizer.json", out, 0.01, "text", w)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            tokens = m.train.tokens + m.val.tokens
            if first is None:
                first = (out / "train.bin").read_bytes()
            assert (out / "train.bin").read_bytes() == first, "token files differ between worker counts"
            base = base or tokens / wall
            rows.append((w, n, tokens, wall, cpu, tokens / wall, tokens / wall / base))
        print(f"data prepare: {size / (1 << 20):.1f} MiB JSONL, {n:,} documents, vocabulary {args.vocab:,}")
        print(f"{'workers':>7} {'docs':>9} {'tokens':>11} {'wall s':>7} {'cpu s':>6} {'tokens/s':>11} {'× 1 proc':>8}")
        for w, docs_n, tokens, wall, cpu, rate, ratio in rows:
            print(f"{w:>7} {docs_n:>9,} {tokens:>11,} {wall:>7.2f} {cpu:>6.2f} {rate:>11,.0f} {ratio:>8.2f}")


if __name__ == "__main__":
    main()
