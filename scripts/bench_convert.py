"""Conversion throughput on a synthetic checkpoint of realistic proportions.

Builds a BF16 Qwen3.5-style checkpoint whose target shards are large and whose
drafter (one MTP layer + fc) sits in the last, mixed shard, then times, side by
side in one run:

  * ``cp`` of the whole source (what a naive "rewrite everything" costs),
  * ``mtpconv quantize-mtp`` (links untouched shards, rewrites the mixed one,
    hashes the linked shards for the manifest), with ``--copy``, and on the same
    directory once it carries ``hf download --local-dir`` records (hashes known),
  * reading the drafter tensors alone (the floor for the rewrite).

    python scripts/bench_convert.py [--target-gb 8] [--hidden 4096] [--dir /tmp/bench]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file


def _build(root: Path, target_gb: float, hidden: int, inter: int) -> tuple[int, int]:
    root.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    shard_bytes = 1 << 30
    n_target = max(1, int(target_gb))
    weight_map: dict[str, str] = {}
    total = 0
    files = n_target + 1
    for i in range(n_target):
        name = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        rows = shard_bytes // 2 // hidden
        t = {f"model.layers.{i}.mlp.big.weight": torch.randn(rows, hidden, generator=g).to(torch.bfloat16)}
        save_file(t, str(root / name))
        weight_map.update({k: name for k in t})
        total += shard_bytes
    h, q = hidden, 2 * hidden
    drafter = {
        "mtp.fc.weight": (h, 2 * h),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * q, h),
        "mtp.layers.0.self_attn.k_proj.weight": (h // 8, h),
        "mtp.layers.0.self_attn.v_proj.weight": (h // 8, h),
        "mtp.layers.0.self_attn.o_proj.weight": (h, q),
        "mtp.layers.0.mlp.gate_proj.weight": (inter, h),
        "mtp.layers.0.mlp.up_proj.weight": (inter, h),
        "mtp.layers.0.mlp.down_proj.weight": (h, inter),
    }
    last = f"model-{files:05d}-of-{files:05d}.safetensors"
    t = {k: (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16) for k, s in drafter.items()}
    for n in (
        "mtp.norm.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.layers.0.input_layernorm.weight",
        "mtp.layers.0.post_attention_layernorm.weight",
    ):
        t[n] = torch.ones(h, dtype=torch.bfloat16)
    t["lm_head.weight"] = torch.randn(32768, h, generator=g).to(torch.bfloat16)
    t["model.embed_tokens.weight"] = torch.randn(32768, h, generator=g).to(torch.bfloat16)
    drafter_bytes = sum(v.numel() * 2 for k, v in t.items() if k.startswith("mtp."))
    save_file(t, str(root / last))
    weight_map.update({k: last for k in t})
    total += sum(v.numel() * 2 for v in t.values())
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (root / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3_5_text",
                "architectures": ["Qwen3_5ForCausalLM"],
                "hidden_size": h,
                "num_hidden_layers": n_target,
                "mtp_num_hidden_layers": 1,
                "vocab_size": 32768,
            }
        )
    )
    return total, drafter_bytes


def _write_download_records(src: Path) -> None:
    import hashlib

    meta = src / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True, exist_ok=True)
    for shard in src.glob("*.safetensors"):
        digest = hashlib.sha256(shard.read_bytes()).hexdigest()
        (meta / f"{shard.name}.metadata").write_text(f"{'0' * 40}\n{digest}\n{time.time() + 5}\n")


def _timed(cmd: list[str]) -> float:
    subprocess.run(["sync"], check=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-gb", type=float, default=8)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=12288)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/mtpconv-bench"))
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    src = args.dir / "src"
    total, drafter = _build(src, args.target_gb, args.hidden, args.intermediate)
    mtpconv = [sys.executable, "-m", "mtpconv", "--quiet"]
    t_cp = _timed(["cp", "-r", str(src), str(args.dir / "copy")])
    t_conv = _timed([*mtpconv, "quantize-mtp", str(src), str(args.dir / "v"), "--device", args.device])
    t_conv_copy = _timed(
        [*mtpconv, "quantize-mtp", str(src), str(args.dir / "vc"), "--device", args.device, "--copy"]
    )
    _write_download_records(src)  # as `hf download --local-dir` leaves them
    t_conv_hf = _timed([*mtpconv, "quantize-mtp", str(src), str(args.dir / "vh"), "--device", args.device])
    gb = 1 << 30
    rows = [
        ("source size", f"{total / gb:.2f} GiB (drafter {drafter / gb:.2f} GiB)"),
        ("cp -r of the source", f"{t_cp:.2f} s"),
        ("quantize-mtp (links)", f"{t_conv:.2f} s  ({t_conv / t_cp:.2f}x cp)"),
        ("quantize-mtp --copy", f"{t_conv_copy:.2f} s  ({t_conv_copy / t_cp:.2f}x cp)"),
        ("quantize-mtp (links, hf local-dir download)", f"{t_conv_hf:.2f} s  ({t_conv_hf / t_cp:.2f}x cp)"),
    ]
    print("| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
