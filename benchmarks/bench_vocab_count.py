"""`mtpconv build-draft-vocab` vs raw `Tokenizer.encode_batch`, both as whole processes, side by side.

    python scripts/bench_vocab_count.py [--source CKPT_DIR] [--corpus FILE.jsonl] [--mb 76] [--repeat 5]

Without --source, trains a byte-level BPE tokenizer on text from
:func:`fixtures.tokenizers.generate_text` and writes a minimal checkpoint
directory (tokenizer.json, tokenizer_config.json, config.json). Without --corpus,
writes a JSON Lines corpus of about --mb MiB of the same kind of text (each
record: 20 generated lines, some with a special token written literally).

Each round runs, in alternating order so that drifting load hits both alike:

- raw: a fresh ``python`` that loads tokenizer.json, reads the JSONL file the
  simplest way (``json.loads(line)["text"]`` per line) and calls
  ``Tokenizer.encode_batch(texts, add_special_tokens=False)`` on every 1000
  lines, summing ``len(e.ids)``: bare encoding, start-up included;
- ours: a fresh ``python -m mtpconv build-draft-vocab SRC --corpus FILE --size K
  -o OUT -q``: start-up, read + parse, encode, count, sha256, select, write.

Prints every run (wall, CPU of the child, load average before it), the best and
the median of each, and the ratios raw / ours (above 1: build-draft-vocab is the
faster one): of the best runs, of the medians, and the median of the per-round
ratios. The fixed cost of each (the same commands on a 10-record corpus) is
measured the same way. Both must count the same number of tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fixtures.tokenizers import DEFAULT_SPECIAL_TOKENS, generate_text, write_tiny_tokenizer

RAW = """
import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
n, batch = 0, []
with open(sys.argv[2], encoding="utf-8") as f:
    for line in f:
        batch.append(json.loads(line)["text"])
        if len(batch) == 1000:
            n += sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))
            batch = []
n += sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))
print(n)
"""


def _make_source(directory: Path, vocab_size: int) -> Path:
    write_tiny_tokenizer(directory, vocab_size, texts=generate_text(20000, seed=0))
    config = {"model_type": "bench", "vocab_size": vocab_size, "eos_token_id": 2}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _make_corpus(path: Path, mib: float) -> Path:
    rng = random.Random(0)
    target = int(mib * (1 << 20))
    written, seed = 0, 1
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            lines = generate_text(2000, seed=seed)
            seed += 1
            for i in range(0, len(lines), 20):
                chunk = lines[i : i + 20]
                if rng.random() < 0.2:
                    chunk.append(rng.choice(DEFAULT_SPECIAL_TOKENS))
                line = json.dumps({"text": "\n".join(chunk)}, ensure_ascii=False) + "\n"
                f.write(line)
                written += len(line.encode())
    return path


def _run(cmd: list[str]) -> tuple[float, float, float, str]:
    """(wall s, child CPU s, 1-min load average before, stdout) of one command."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, load, done.stdout


def _commands(source: Path, corpus: Path, size: int, out: Path) -> dict[str, list[str]]:
    return {
        "raw encode_batch": [sys.executable, "-c", RAW, str(source / "tokenizer.json"), str(corpus)],
        "build-draft-vocab": [sys.executable, "-m", "mtpconv", "build-draft-vocab", str(source)]
        + ["--corpus", str(corpus), "--size", str(size), "-o", str(out), "-q"],
    }


def _bench(name: str, cmds: dict[str, list[str]], repeat: int, out: Path) -> dict[str, list[float]]:
    """Alternating rounds; returns wall times per command; checks both count alike."""
    walls: dict[str, list[float]] = {k: [] for k in cmds}
    cpus: dict[str, list[float]] = {k: [] for k in cmds}
    print(f"{name}:", flush=True)
    for r in range(repeat):
        order = list(cmds) if r % 2 == 0 else list(reversed(cmds))
        tokens = {}
        for key in order:
            wall, cpu, load, stdout = _run(cmds[key])
            walls[key].append(wall)
            cpus[key].append(cpu)
            if key == "raw encode_batch":
                tokens[key] = int(stdout.split()[-1])
            else:
                tokens[key] = json.loads(Path(str(out) + ".json").read_text())["corpus"]["tokens"]
            print(
                f"  round {r + 1} {key:18s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  load {load:4.1f}",
                flush=True,
            )
        assert len(set(tokens.values())) == 1, tokens
    for key in cmds:
        print(
            f"  {key:18s} wall best {min(walls[key]):6.2f} median {statistics.median(walls[key]):6.2f} s"
            f"   cpu best {min(cpus[key]):6.2f} median {statistics.median(cpus[key]):6.2f} s"
        )
    raw, ours = walls["raw encode_batch"], walls["build-draft-vocab"]
    paired = [a / b for a, b in zip(raw, ours, strict=True)]
    cpu_raw, cpu_ours = cpus["raw encode_batch"], cpus["build-draft-vocab"]
    print(
        f"  ratio raw / build-draft-vocab: wall best {min(raw) / min(ours):.3f}"
        f"  wall median {statistics.median(raw) / statistics.median(ours):.3f}"
        f"  per round {' '.join(f'{x:.2f}' for x in paired)} (median {statistics.median(paired):.3f})"
        f"  cpu best {min(cpu_raw) / min(cpu_ours):.3f}",
        flush=True,
    )
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, help="checkpoint dir with tokenizer.json + config.json")
    parser.add_argument("--corpus", type=Path, help="JSONL corpus with a 'text' field")
    parser.add_argument("--mb", type=float, default=76.0, help="generated corpus size (MiB)")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--size", type=int, default=1024, help="K for build-draft-vocab")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_vocab_"))
    source = args.source or _make_source(work / "ckpt", args.vocab_size)
    corpus = args.corpus or _make_corpus(work / "corpus.jsonl", args.mb)
    tiny = work / "tiny.jsonl"
    with open(corpus, encoding="utf-8") as f:
        tiny.write_text("".join(next(f) for _ in range(10)), encoding="utf-8")
    out = work / "ids.pt"
    import tokenizers

    print(
        f"python {sys.version.split()[0]}, tokenizers {tokenizers.__version__}, {os.cpu_count()} CPUs, "
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; corpus {corpus} "
        f"{corpus.stat().st_size / (1 << 20):.1f} MiB",
        flush=True,
    )
    _bench("fixed cost (10-record corpus)", _commands(source, tiny, args.size, out), args.repeat, out)
    _bench(f"corpus {corpus.name}", _commands(source, corpus, args.size, out), args.repeat, out)
    print(f"load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
