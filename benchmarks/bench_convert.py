"""What quantize-mtp costs, side by side in one run: does the cost follow the drafter?

Builds two BF16 Qwen3.5-style checkpoints that differ only in the target (default
2.4 GB and 9.6 GB of target shards) and share the same ~2 GB BF16 drafter in its
own shard, each as a plain local directory and as a Hugging Face cache snapshot
(blobs hard-linked to the same files, so no extra disk). Then times:

  * ``mtpconv quantize-mtp`` of each (best of ``--repeat`` rounds), with its peak RSS,
  * ``dd if=DRAFTER_SHARD of=X bs=16M conv=fsync`` (a durable copy of the drafter), once
    in every round (each round runs every case, so drifts of this machine's disk and CPU
    speed reach all of them alike),
  * a read + rewrite (``dd ... conv=fsync``) of every shard of the larger one
    (what a whole-model converter does at least),
  * ``mtpconv inspect DIR`` against starting bare Python (``python -c pass``),

and prints the issue's ratios as one Markdown table. The shard a run reads first is
read once before it (a warm page cache for every case). Everything is deleted after.

    python scripts/bench_convert.py [--small-gb 2.4] [--large-gb 9.6] [--drafter-layers 4]
        [--hidden 4096] [--intermediate 12288] [--dir /tmp/mtpconv-bench] [--repeat 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from mtpconv.checkpoint.writer import TensorSpec, safetensors_header

_BLOCK = 32 << 20  # bytes of random BF16 tiled into every tensor (content is irrelevant)
_COMMIT = "0123456789abcdef0123456789abcdef01234567"
_REPO = "bench/target-{}"
_VOCAB = 32768


def _random_block() -> bytes:
    rng = np.random.default_rng(0)
    vals = (rng.standard_normal(_BLOCK // 2, dtype=np.float32) * 0.02).view(np.uint32)
    return (vals >> 16).astype(np.uint16).tobytes()  # finite BF16 (truncated float32)


def _write_shard(path: Path, tensors: dict[str, tuple[int, ...]], block: bytes) -> str:
    """A BF16 safetensors file filled with ``block`` repeated; returns its sha256."""
    specs = [TensorSpec(n, "BF16", s) for n, s in tensors.items()]
    sha = hashlib.sha256()
    with open(path, "wb") as f:
        head = safetensors_header(specs, {"format": "pt"})
        f.write(head)
        sha.update(head)
        for spec in specs:
            left = spec.nbytes
            while left:
                chunk = block[: min(left, len(block))]
                f.write(chunk)
                sha.update(chunk)
                left -= len(chunk)
    return sha.hexdigest()


def _drafter(layers: int, h: int, inter: int) -> dict[str, tuple[int, ...]]:
    t: dict[str, tuple[int, ...]] = {"mtp.fc.weight": (h, 2 * h)}
    for n in ("mtp.norm.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.pre_fc_norm_embedding.weight"):
        t[n] = (h,)
    for i in range(layers):
        p = f"mtp.layers.{i}."
        t |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (4 * h, h),
            p + "self_attn.k_proj.weight": (h // 8, h),
            p + "self_attn.v_proj.weight": (h // 8, h),
            p + "self_attn.o_proj.weight": (h, 2 * h),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
    return t


def _build(root: Path, target_gb: float, args: argparse.Namespace, block: bytes) -> dict[str, str]:
    """A checkpoint with ``target_gb`` of target shards (1.2 GB each) and the drafter shard."""
    root.mkdir(parents=True)
    h = args.hidden
    per = int(1.2e9)
    n = max(1, round(target_gb * 1e9 / per))
    files = n + 1
    shards: dict[str, dict[str, tuple[int, ...]]] = {}
    for i in range(n):
        t: dict[str, tuple[int, ...]] = {f"model.layers.{i}.mlp.big.weight": (per // 2 // h, h)}
        if i == 0:  # embedding and head live in the target, as in real checkpoints
            t = {"model.embed_tokens.weight": (_VOCAB, h), "lm_head.weight": (_VOCAB, h)}
            t[f"model.layers.{i}.mlp.big.weight"] = ((per - 4 * _VOCAB * h) // 2 // h, h)
        shards[f"model-{i + 1:05d}-of-{files:05d}.safetensors"] = t
    shards[f"model-{files:05d}-of-{files:05d}.safetensors"] = _drafter(
        args.drafter_layers, h, args.intermediate
    )
    digests = {name: _write_shard(root / name, t, block) for name, t in shards.items()}
    weight_map = {k: name for name, t in shards.items() for k in t}
    total = sum(TensorSpec(k, "BF16", s).nbytes for t in shards.values() for k, s in t.items())
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    config = {
        "model_type": "qwen3_5_text",
        "architectures": ["Qwen3_5ForCausalLM"],
        "hidden_size": h,
        "num_hidden_layers": n,
        "mtp_num_hidden_layers": args.drafter_layers,
        "vocab_size": _VOCAB,
    }
    (root / "config.json").write_text(json.dumps(config))
    for p in root.iterdir():
        if p.name not in digests:
            digests[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return digests


def _hub_cache(hf_home: Path, repo_id: str, src: Path, digests: dict[str, str]) -> None:
    """``src`` laid out as huggingface_hub's cache: blobs (hard links to the same
    files, named by sha256) and a snapshot of symlinks."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / _COMMIT
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(_COMMIT)
    for name, digest in digests.items():
        blob = repo / "blobs" / digest
        os.link(src / name, blob)
        (snap / name).symlink_to(os.path.relpath(blob, snap))


_RSS = (
    "import resource, subprocess, sys, time\n"
    "t = time.perf_counter(); subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
    "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def _run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """(wall seconds, peak RSS in KiB) of ``cmd``, measured by a fresh parent."""
    subprocess.run(["sync"], check=True)
    out = subprocess.run(
        [sys.executable, "-c", _RSS, *cmd], check=True, capture_output=True, text=True, env=env
    )
    secs, rss = out.stdout.split()
    return float(secs), int(rss)


def _warm(path: Path) -> None:
    """Read ``path`` once, so a measurement finds it in the page cache (another case's
    output or `dd` may have pushed it out; then a run would time the disk's reads)."""
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def _dd(src: Path, dst: Path) -> float:
    secs, _ = _run(["dd", f"if={src}", f"of={dst}", "bs=16M", "conv=fsync", "status=none"])
    dst.unlink()
    return secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small-gb", type=float, default=2.4)
    ap.add_argument("--large-gb", type=float, default=9.6)
    ap.add_argument("--drafter-layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=12288)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/mtpconv-bench"))
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    block = _random_block()
    hf_home = args.dir / "hf_home"
    srcs, digests = {}, {}
    for label, gb in (("small", args.small_gb), ("large", args.large_gb)):
        srcs[label] = args.dir / f"src-{label}"
        digests[label] = _build(srcs[label], gb, args, block)
        _hub_cache(hf_home, _REPO.format(label), srcs[label], digests[label])
    try:
        _measure(args, srcs, hf_home)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


def _measure(args: argparse.Namespace, srcs: dict[str, Path], hf_home: Path) -> None:
    mtpconv = [sys.executable, "-m", "mtpconv", "--quiet"]
    hub_env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    gb = 1e9
    sizes = {k: sum(p.stat().st_size for p in v.glob("*.safetensors")) for k, v in srcs.items()}
    drafter_shard = sorted(srcs["large"].glob("*.safetensors"))[-1]
    conv: dict[tuple[str, str], tuple[float, int]] = {}
    dd = float("inf")
    # Rounds, each running every case once and the drafter-shard `dd`: this machine's disk
    # and CPU speed drift within minutes, so every figure's best comes from the same rounds.
    for r in range(args.repeat):
        for label in ("small", "large"):
            for where in ("local", "hf-cache"):
                out = args.dir / f"v-{label}-{where}-{r}"
                spec = str(srcs[label]) if where == "local" else _REPO.format(label)
                _warm(sorted(srcs[label].glob("*.safetensors"))[-1])  # its drafter shard
                secs, rss = _run(
                    [*mtpconv, "quantize-mtp", spec, str(out), "--device", "cpu"],
                    env=hub_env if where == "hf-cache" else None,
                )
                shutil.rmtree(out)
                best = conv.get((label, where), (float("inf"), 0))
                conv[label, where] = (min(best[0], secs), max(best[1], rss))
        _warm(drafter_shard)
        dd = min(dd, _dd(drafter_shard, args.dir / "dd.out"))
    rewrite = sum(_dd(p, args.dir / "rw.out") for p in sorted(srcs["large"].glob("*.safetensors")))
    bare = min(_run([sys.executable, "-c", "pass"])[0] for _ in range(5))
    insp = min(_run([*mtpconv, "inspect", str(srcs["small"])])[0] for _ in range(5))

    print(
        f"drafter shard {drafter_shard.stat().st_size / gb:.2f} GB; target shards "
        f"{(sizes['small'] - drafter_shard.stat().st_size) / gb:.2f} GB vs "
        f"{(sizes['large'] - drafter_shard.stat().st_size) / gb:.2f} GB\n"
    )
    print("| measure | local dir | HF cache |\n|---|---|---|")
    for label in ("small", "large"):
        cells = [
            f"{conv[label, w][0]:.2f} s, peak RSS {conv[label, w][1] / 1024:.0f} MiB"
            for w in ("local", "hf-cache")
        ]
        print(f"| quantize-mtp, {label} target | {cells[0]} | {cells[1]} |")
    ratio = [conv["large", w][0] / conv["small", w][0] for w in ("local", "hf-cache")]
    print(f"| large / small (target: within 1.15) | {ratio[0]:.2f} | {ratio[1]:.2f} |")
    vs_dd = [conv["large", w][0] / dd for w in ("local", "hf-cache")]
    print(f"| large / dd of the drafter shard ({dd:.2f} s; target <= 3) | {vs_dd[0]:.2f} | {vs_dd[1]:.2f} |")
    vs_rw = [conv["large", w][0] / rewrite for w in ("local", "hf-cache")]
    print(
        f"| large / read+rewrite of every shard ({rewrite:.2f} s; target <= 0.4) "
        f"| {vs_rw[0]:.2f} | {vs_rw[1]:.2f} |"
    )
    print(
        f"\n`mtpconv inspect` {insp:.2f} s vs bare `python -c pass` {bare:.2f} s: "
        f"+{insp - bare:.2f} s (target <= 0.5 s)"
    )


if __name__ == "__main__":
    main()
