"""GPU vs CPU throughput of the conversion math (FP8 quantization, NVFP4 -> FP8).

Times ``mtpconv.formats.fp8.quantize_fp8`` and NVFP4 dequantization followed by
FP8 quantization on the CPU and on CUDA, at drafter-sized tensors, and checks
that the CUDA bytes equal the CPU bytes. GB/s counts the source tensor's bytes
(what the converter reads). Two GPU figures: device-resident (the math alone)
and end to end (host tensor -> GPU -> quantize -> host), which is what a
``--device cuda`` converter sees per tensor.

Usage (repo root)::

    PYTHONPATH=. python scripts/bench_quantize_gpu.py --out OUTDIR
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mtpconv.formats.fp8 import Fp8Tensor, quantize_fp8
from mtpconv.formats.nvfp4 import GROUP_SIZE, dequantize_nvfp4


def _median_s(fn: Callable[[], Any], reps: int, cuda: bool) -> float:
    fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _same(a: Fp8Tensor, b: Fp8Tensor) -> bool:
    return torch.equal(a.weight.cpu().view(torch.uint8), b.weight.cpu().view(torch.uint8)) and (
        torch.equal(a.scale.cpu().view(torch.int32), b.scale.cpu().view(torch.int32))
    )


def _nvfp4(out_f: int, in_f: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    packed = torch.randint(0, 256, (out_f, in_f // 2), generator=gen, dtype=torch.uint8)
    block = (torch.rand(out_f, in_f // GROUP_SIZE, generator=gen) * 400 + 1).to(torch.float8_e4m3fn)
    return packed, block, torch.tensor(2.5e-4)


def _digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.glob("*.safetensors"))
    }


def time_cli(drafter_quant: str, workdir: Path) -> list[dict[str, Any]]:
    """Whole ``mtpconv quantize-mtp`` on a synthetic checkpoint, --device cpu vs cuda."""
    from fixtures.checkpoints import Spec, write_checkpoint

    src = workdir / f"src-{drafter_quant}"
    spec = Spec(
        family="qwen3_5",
        hidden=4096,
        intermediate=12288,
        heads=16,
        kv_heads=4,
        head_dim=256,
        vocab=32768,
        layers=1,
        quant="bf16",
        drafter_quant=drafter_quant,
        shards=2,
    )
    t0 = time.perf_counter()
    write_checkpoint(src, spec)
    built = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    rows = []
    digests = {}
    for device in ("cpu", "cuda"):
        dst = workdir / f"dst-{drafter_quant}-{device}"
        cmd = [
            sys.executable,
            "-m",
            "mtpconv",
            "quantize-mtp",
            str(src),
            str(dst),
            "--device",
            device,
            "--force",
            "--fp8-from-4bit",  # the NVFP4 drafter case times the dequantize path on purpose
        ]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        wall = time.perf_counter() - t0
        ok = done.returncode == 0
        digests[device] = _digests(dst) if ok else {}
        rows.append(
            {
                "source": f"synthetic qwen3_5 drafter {drafter_quant}",
                "source_bytes": size,
                "device": device,
                "wall_s": wall,
                "ok": ok,
                "stderr_tail": done.stderr[-600:] if not ok else "",
                "build_s": built,
            }
        )
    same = bool(digests["cpu"]) and digests["cpu"] == digests["cuda"]
    for r in rows:
        r["outputs_identical"] = same
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu-reps", type=int, default=3)
    ap.add_argument("--gpu-reps", type=int, default=10)
    ap.add_argument("--cli", action="store_true", help="also time the whole quantize-mtp CLI")
    ap.add_argument("--cli-only", action="store_true", help="only the CLI timing")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_quantize_gpu needs a CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    meta = {
        "device": torch.cuda.get_device_name(dev),
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
    }
    print(meta, flush=True)
    cases: list[tuple[str, torch.Tensor]] = []
    if not args.cli_only:
        cases = [
            ("bf16 down_proj 5120x17408", torch.randn(5120, 17408, generator=gen).to(torch.bfloat16)),
            ("bf16 fc 5120x10240", torch.randn(5120, 10240, generator=gen).to(torch.bfloat16)),
            (
                "bf16 experts 64x2048x4096 (3-D)",
                torch.randn(64, 2048, 4096, generator=gen).to(torch.bfloat16),
            ),
        ]
    rows: list[dict[str, Any]] = []
    for name, w in cases:
        nbytes = w.numel() * w.element_size()
        cpu_s = _median_s(lambda w=w: quantize_fp8(w), args.cpu_reps, cuda=False)
        wd = w.to(dev)
        gpu_s = _median_s(lambda wd=wd: quantize_fp8(wd), args.gpu_reps, cuda=True)

        def e2e(w: torch.Tensor = w) -> Fp8Tensor:
            q = quantize_fp8(w.to(dev, non_blocking=False))
            return Fp8Tensor(q.weight.cpu(), q.scale.cpu())

        e2e_s = _median_s(e2e, args.gpu_reps, cuda=True)
        same = _same(quantize_fp8(w), quantize_fp8(wd))
        rows.append(
            {
                "case": f"quantize_fp8 {name}",
                "bytes": nbytes,
                "cpu_s": cpu_s,
                "gpu_s": gpu_s,
                "gpu_e2e_s": e2e_s,
                "identical": same,
            }
        )
        del wd
    for out_f, in_f in () if args.cli_only else ((5120, 17408), (17408, 5120)):
        packed, block, s2 = _nvfp4(out_f, in_f, gen)
        nbytes = packed.numel() + block.numel() + 4

        def cpu_fn(p: torch.Tensor = packed, b: torch.Tensor = block, s: torch.Tensor = s2) -> Fp8Tensor:
            return quantize_fp8(dequantize_nvfp4(p, b, s))

        pd, bd, sd = packed.to(dev), block.to(dev), s2.to(dev)

        def gpu_fn(p: torch.Tensor = pd, b: torch.Tensor = bd, s: torch.Tensor = sd) -> Fp8Tensor:
            return quantize_fp8(dequantize_nvfp4(p, b, s))

        def e2e_fn(p: torch.Tensor = packed, b: torch.Tensor = block, s: torch.Tensor = s2) -> Fp8Tensor:
            q = quantize_fp8(dequantize_nvfp4(p.to(dev), b.to(dev), s.to(dev)))
            return Fp8Tensor(q.weight.cpu(), q.scale.cpu())

        cpu_s = _median_s(cpu_fn, args.cpu_reps, cuda=False)
        gpu_s = _median_s(gpu_fn, args.gpu_reps, cuda=True)
        e2e_s = _median_s(e2e_fn, args.gpu_reps, cuda=True)
        same = _same(cpu_fn(), gpu_fn())
        rows.append(
            {
                "case": f"nvfp4->fp8 {out_f}x{in_f}",
                "bytes": nbytes,
                "cpu_s": cpu_s,
                "gpu_s": gpu_s,
                "gpu_e2e_s": e2e_s,
                "identical": same,
            }
        )
    convert = importlib.util.find_spec("mtpconv.commands.quantize_mtp") is not None
    cli_rows: list[dict[str, Any]] = []
    if convert and (args.cli or args.cli_only):
        with tempfile.TemporaryDirectory() as tmp:
            for dq in ("bf16", "nvfp4"):
                cli_rows += time_cli(dq, Path(tmp))
    lines = [
        f"{meta['device']}, CPU threads {meta['cpu_threads']}, torch {meta['torch']}",
        "",
        "| case | source MB | CPU GB/s | GPU GB/s (on device) | GPU GB/s (host->GPU->host) "
        "| CUDA bytes == CPU |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        gb = r["bytes"] / 1e9
        lines.append(
            f"| {r['case']} | {r['bytes'] / 1e6:.0f} | {gb / r['cpu_s']:.2f} | "
            f"{gb / r['gpu_s']:.1f} | {gb / r['gpu_e2e_s']:.2f} | {r['identical']} |"
        )
    if cli_rows:
        lines += [
            "",
            "| quantize-mtp CLI | source MB | --device | wall s | ok | .safetensors outputs cpu == cuda |",
            "|---|---|---|---|---|---|",
        ]
        for r in cli_rows:
            lines.append(
                f"| {r['source']} | {r['source_bytes'] / 1e6:.0f} | {r['device']} | "
                f"{r['wall_s']:.2f} | {r['ok']} | {r['outputs_identical']} |"
            )
            if r["stderr_tail"]:
                lines.append(f"<!-- {r['device']} stderr: {r['stderr_tail']!r} -->")
    elif not convert:
        lines += ["", "mtpconv.commands.quantize_mtp not present: whole-CLI timing not run"]
    md = "\n".join(lines)
    (args.out / "bench_quantize_gpu.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "convert_present": convert, "cli": cli_rows}, indent=1)
    )
    (args.out / "bench_quantize_gpu.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
