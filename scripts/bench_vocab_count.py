"""Throughput of `build-draft-vocab` counting vs raw `Tokenizer.encode_batch`, side by side.

    python scripts/bench_vocab_count.py [--source CKPT_DIR] [--corpus PATH ...] [--mb 40]

Without --source, trains a byte-level BPE tokenizer (--vocab-size, default 32768)
on text from the Python standard library and writes a minimal checkpoint
directory (tokenizer.json + config.json). Without --corpus, writes a JSON Lines
corpus of about --mb MiB from the same kind of text (stdlib sources and docs).

Measured, alternating, best of --repeat runs each:
- raw: `encode_batch` (and `encode_batch_fast`) over the corpus texts already in
  memory, in the same batches the counter uses, add_special_tokens=False;
- ours: `build_draft_vocab(...)` end to end: read + parse the corpus from disk,
  encode, count with numpy, sha256 the corpus files, select top-K, coverage, write.
Prints tokens/s for each (wall clock and per CPU-second of this process) and the
ratios raw time / our time (above 1: build_draft_vocab is faster than bare encoding),
from the best runs and as the median of the per-round ratios (robust to load that
drifts during the run).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mtpconv.commands.build_draft_vocab import build_draft_vocab
from mtpconv.corpus import discover_corpus_files, iter_text_batches


def _stdlib_documents() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        # Split big files into documents of ~60 lines, like chunks of a web corpus.
        lines = text.splitlines()
        docs += ["\n".join(lines[i : i + 60]) for i in range(0, len(lines), 60)]
    return docs


def _make_source(directory: Path, docs: list[str], vocab_size: int) -> Path:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(docs[::4], trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    padded = -(-vocab_size // 64) * 64
    config = {"model_type": "bench", "vocab_size": padded, "eos_token_id": 2}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _make_corpus(path: Path, docs: list[str], mib: float) -> Path:
    rng = random.Random(0)
    target = int(mib * (1 << 20))
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            doc = rng.choice(docs)
            line = json.dumps({"text": doc}) + "\n"
            f.write(line)
            written += len(line.encode())
    return path


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, help="checkpoint dir with tokenizer.json")
    parser.add_argument("--corpus", type=Path, action="append", help="corpus file or dir")
    parser.add_argument("--mb", type=float, default=40.0, help="generated corpus size (MiB)")
    parser.add_argument("--vocab-size", type=int, default=32768)
    parser.add_argument("--size", type=int, default=8192, help="K for build_draft_vocab")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_vocab_"))
    docs = _stdlib_documents() if (args.source is None or not args.corpus) else []
    source = args.source or _make_source(work / "ckpt", docs, args.vocab_size)
    corpora = args.corpus or [_make_corpus(work / "corpus.jsonl", docs, args.mb)]
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))

    files = discover_corpus_files(corpora)
    batches = [b.texts for cf in files for b in iter_text_batches(cf)]
    n_bytes = sum(len(t.encode()) for b in batches for t in b)
    n_tokens = sum(len(e.ids) for b in batches for e in tokenizer.encode_batch_fast(b, False))
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, corpus "
        f"{n_bytes / (1 << 20):.1f} MiB of text in {len(batches)} batches, {n_tokens:,} tokens, "
        f"vocab {tokenizer.get_vocab_size()}",
        flush=True,
    )

    # Best of --repeat for each, alternating so that background load hits all alike.
    # Wall time is what a user waits; CPU time (all threads of this process) is the
    # steadier figure on a shared machine, where other processes steal cores.
    best_wall: dict[str, float] = {}
    best_cpu: dict[str, float] = {}
    rounds: list[dict[str, float]] = []

    def timed(name: str, fn: Callable[[], object]) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        best_wall[name] = min(best_wall.get(name, float("inf")), wall)
        best_cpu[name] = min(best_cpu.get(name, float("inf")), cpu)
        rounds[-1][name] = wall
        print(f"  {name:24s} wall {wall:6.2f} s  cpu {cpu:6.2f} s", flush=True)

    def raw(method: str) -> Callable[[], object]:
        encode = getattr(tokenizer, method)
        return lambda: [encode(b, add_special_tokens=False) for b in batches]

    def ours() -> None:
        report = build_draft_vocab(source, corpora, args.size, work / "ids.pt")
        assert report.corpus.tokens == n_tokens, (report.corpus.tokens, n_tokens)

    for _ in range(args.repeat):
        rounds.append({})
        timed("raw encode_batch", raw("encode_batch"))
        timed("raw encode_batch_fast", raw("encode_batch_fast"))
        timed("build_draft_vocab", ours)

    print("best of each:")
    for name in best_wall:
        print(
            f"{name:24s} wall {best_wall[name]:6.2f} s  {n_tokens / best_wall[name] / 1e6:5.2f} M tok/s"
            f"   cpu {best_cpu[name]:6.2f} s  {n_tokens / best_cpu[name] / 1e6:5.2f} M tok/cpu-s"
        )
    for base in ("raw encode_batch", "raw encode_batch_fast"):
        print(
            f"ratio build_draft_vocab / {base}: wall {best_wall[base] / best_wall['build_draft_vocab']:.3f}"
            f"  cpu {best_cpu[base] / best_cpu['build_draft_vocab']:.3f}"
        )
        paired = [r[base] / r["build_draft_vocab"] for r in rounds]
        print(f"  wall, per round: {' '.join(f'{x:.2f}' for x in paired)}; median {_median(paired):.3f}")


if __name__ == "__main__":
    main()
