#!/usr/bin/env python
"""Build the bundle that brings real vLLM to the device machine, which has no package registry.

vLLM 0.26.0 is the newest vLLM whose torch pin (torch==2.11.0) equals the device's torch
(2.11.0+cu130, Python 3.12); 0.27 and later pin torch 2.13/2.14. The bundle holds:
- vLLM's wheel, unpacked, stripped of what an H100/H200 run does not load (:data:`STRIPPED`),
  recompressed with zstd;
- the wheels of its light dependencies, resolved against what the device's image already has
  (:data:`DEVICE_PINS`) and leaving out what it has (:data:`DEVICE_HAS`) or what the offline
  engine never imports (:data:`NOT_NEEDED`); the resolution used is pinned in
  ``resolved-0.26.0.txt`` beside this file (``--resolve`` makes it again with uv);
- mtpconv's own wheel (its entry point registers the plugin).
It is split into parts of :data:`PART_MIB` MiB: one device call carries at most 64 MiB with the
working tree. Ship them in back-to-back calls, each ``mkdir -p /tmp/vb && cp .gpuv/pNN /tmp/vb/``
with ``carry: [".gpuv/pNN"]`` (the last one also carrying ``.gpuv/zstandard-*.whl``), then run
``benchmarks/gpu_e2e/setup_on_device.sh`` (README: "GPU end to end").

    python -m benchmarks.gpu_e2e.bundle [--out .gpuv] [--resolve]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VLLM_VERSION = "0.26.0"
RESOLVED = HERE / f"resolved-{VLLM_VERSION}.txt"
CALL_LIMIT_MIB = 64  # what one device call carries, working tree included
PART_MIB = 51  # leaves room for the working tree and the zstandard wheel
# The device image's versions of what vLLM also needs (KINDS.md, "Python packages already there",
# read 2026-11-17; versions from `pip show` there): the resolution must agree with them.
DEVICE_PINS = {
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "tokenizers": "0.23.2",
    "huggingface_hub": "1.33.0",
    "safetensors": "0.8.0",
    "numpy": "2.5.2",
    "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0",
    "triton": "3.6.0",
}
# Already on the device (its image), so never shipped.
DEVICE_HAS = frozenset(
    {
        *DEVICE_PINS,
        "huggingface-hub",
        "sympy",
        "networkx",
        "mpmath",
        "setuptools",
        "hf-xet",
        "grpcio",
        "pillow",
        "uvloop",
    }
)
DEVICE_HAS_PREFIXES = ("nvidia-", "cuda-")
# vLLM requirements the offline engine (LLM) never imports on these runs: media and audio stacks,
# other vendors' kernels, FlashInfer (its kernels are JIT-built; the runs use FlashAttention, the
# Triton GDN prefill and VLLM_USE_FLASHINFER_SAMPLER=0), the API server's optional services.
VLLM_REQUIREMENTS_SKIPPED = (
    "torchaudio",
    "torchvision",
    "torchcodec",
    "PyNvVideoCodec",
    "flashinfer",
    "tilelang",
    "nvtx",
    "fastsafetensors",
    "quack",
    "tokenspeed",
    "humming",
    "opencv",
    "mistral_common",
    "numba",
)
NOT_NEEDED = frozenset(
    {
        "anthropic",
        "cryptography",
        "pyjwt",
        "opentelemetry-exporter-otlp-proto-grpc",
        "sentry-sdk",
        "fastapi-cloud-cli",
        "rignore",
        "fastar",
        "supervisor",
    }
)
# Inside vLLM's wheel: FlashAttention-2 (Hopper runs FlashAttention-3), the Rust router binary,
# the SM100 FMHA sources.
STRIPPED = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs", "vllm/third_party/fmha_sm100")
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)
PLATFORMS += (
    "manylinux_2_24_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_35_x86_64",
)


def _name(requirement: str) -> str:
    """The normalized project name of ``name==1.0`` / ``name>=1; marker`` / ``Name_X[extra]``."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else ""


def requirements_to_resolve(requires_dist: Iterable[str]) -> list[str]:
    """vLLM's ``Requires-Dist`` lines without extras and without :data:`VLLM_REQUIREMENTS_SKIPPED`."""
    skipped = tuple(_name(s) for s in VLLM_REQUIREMENTS_SKIPPED)
    return [
        r.strip()
        for r in requires_dist
        if r.strip()
        and "extra ==" not in r
        and not _name(r).startswith(skipped)
        and not _name(r).startswith(DEVICE_HAS_PREFIXES)
    ]


def to_ship(resolved: Iterable[str]) -> list[str]:
    """The pinned lines of a resolution the device does not already have and the engine imports."""
    has = {_name(n) for n in DEVICE_HAS}
    out = []
    for line in resolved:
        line = line.split("#", 1)[0].strip()
        name = _name(line)
        if not line or name in has or name in NOT_NEEDED or name.startswith(DEVICE_HAS_PREFIXES):
            continue
        out.append(line)
    return out


def split(path: Path, out: Path, part_bytes: int) -> list[Path]:
    """``path`` cut into ``out/p00, p01, ...`` of at most ``part_bytes`` each."""
    parts = []
    with path.open("rb") as src:
        while chunk := src.read(part_bytes):
            part = out / f"p{len(parts):02d}"
            part.write_bytes(chunk)
            parts.append(part)
    return parts


def _pip_download(dest: Path, *requirements: str, file: Path | None = None) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += [
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--abi",
        "cp312",
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    cmd += ["-d", str(dest), *requirements] + (["-r", str(file)] if file else [])
    subprocess.run(cmd, check=True)


def _resolve(vllm_wheel: Path, work: Path) -> list[str]:
    """Resolve vLLM's requirements for the device with uv (pinned to what the device has)."""
    with zipfile.ZipFile(vllm_wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            ln[len("Requires-Dist: ") :]
            for ln in z.read(meta).decode().splitlines()
            if ln.startswith("Requires-Dist: ")
        ]
    (work / "req.txt").write_text("\n".join(requirements_to_resolve(requires)) + "\n")
    (work / "constraints.txt").write_text("".join(f"{n}=={v}\n" for n, v in DEVICE_PINS.items()))
    subprocess.run([sys.executable, "-m", "venv", str(work / "uv")], check=True)
    subprocess.run([str(work / "uv/bin/pip"), "install", "-q", "uv"], check=True)
    compile_cmd = [
        str(work / "uv/bin/uv"),
        "pip",
        "compile",
        str(work / "req.txt"),
        "-c",
        str(work / "constraints.txt"),
    ]
    compile_cmd += [
        "--python-version",
        "3.12",
        "--python-platform",
        "x86_64-manylinux_2_28",
        "--no-header",
        "--no-annotate",
    ]
    done = subprocess.run(compile_cmd, check=True, capture_output=True, text=True)
    return [ln for ln in done.stdout.splitlines() if ln.strip()]


def build(out: Path, *, resolve: bool) -> list[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _pip_download(work / "vllm", f"vllm=={VLLM_VERSION}")
        wheel = next((work / "vllm").glob("vllm-*.whl"))
        resolved = _resolve(wheel, work) if resolve else RESOLVED.read_text().splitlines()
        if resolve:
            RESOLVED.write_text("\n".join(resolved) + "\n")
        bundle = work / "bundle"
        (bundle / "wheels").mkdir(parents=True)
        (work / "ship.txt").write_text("\n".join(to_ship(resolved)) + "\n")
        _pip_download(bundle / "wheels", file=work / "ship.txt")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "-w",
                str(bundle / "wheels"),
                str(ROOT),
            ],
            check=True,
        )
        unpacked = work / "x"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(unpacked)
        for rel in STRIPPED:
            target = unpacked / rel
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        tar = work / "vllm.tar"
        with tarfile.open(tar, "w") as t:
            for entry in sorted(unpacked.iterdir()):
                t.add(entry, arcname=entry.name)
        subprocess.run(["zstd", "-19", "-T0", "-q", str(tar), "-o", str(bundle / "vllm.tar.zst")], check=True)
        with tarfile.open(work / "bundle.tar", "w") as t:
            t.add(bundle, arcname="bundle")
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("p[0-9][0-9]"):
            old.unlink()
        parts = split(work / "bundle.tar", out, PART_MIB << 20)
    _pip_download(out, "zstandard")  # for a device without the zstd command
    return parts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=ROOT / ".gpuv", help="where the parts go (git-ignored)")
    ap.add_argument(
        "--resolve", action="store_true", help=f"resolve again with uv and rewrite {RESOLVED.name}"
    )
    a = ap.parse_args(argv)
    parts = build(a.out, resolve=a.resolve)
    for p in parts:
        print(f"{p}  {p.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
