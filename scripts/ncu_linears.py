"""One launch of each kernel that issue 12 compares, for Nsight Compute (CUDA).

Runs every case once to warm up (compile, autotune nothing), then once more between
``cudaProfilerStart`` / ``cudaProfilerStop``, so that::

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section LaunchStats --section Occupancy --section WarpStateStats \
        --section MemoryWorkloadAnalysis python3 scripts/ncu_linears.py

profiles exactly one launch per case, on Qwen3.5-27B shapes: the skinny GEMM,
cuBLAS BF16, the ``scaled_mm_static`` path (a static activation quantization, then
``torch._scaled_mm``) and the pure-read kernel of ``bench_read_floor.py`` on the FP8
weight's bytes. ``--cases`` picks some.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_read_floor import read_once  # noqa: E402

from mtpconv.formats.fp8 import quantize_fp8  # noqa: E402
from mtpconv.kernels import Fp8Path, run_path  # noqa: E402
from mtpconv.kernels.triton_skinny import skinny_linear  # noqa: E402

SHAPES = {
    "fc": (5120, 10240),
    "qkv": (14336, 5120),
    "o": (5120, 6144),
    "gate_up": (34816, 5120),
    "down": (5120, 17408),
}
DEFAULT_CASES = "fc:1,o:1,down:1,qkv:1,qkv:4,gate_up:4,qkv:16"


def cases(spec: str, sms: int) -> list[tuple[str, Callable[[], object]]]:
    dev = torch.device("cuda")
    out: list[tuple[str, Callable[[], object]]] = []
    for item in spec.split(","):
        name, tokens = item.split(":")
        n, k = SHAPES[name]
        t = int(tokens)
        w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
        q = quantize_fp8(w)
        x = torch.randn(t, k, device=dev).to(torch.bfloat16)
        one = torch.tensor(4.0 / 448.0, device=dev)
        words = q.weight.view(torch.int32).reshape(-1)
        sink = torch.empty(8 * sms * 64, dtype=torch.int32, device=dev)
        out += [
            (f"skinny {name} T={t}", lambda x=x, q=q: skinny_linear(x, q.weight, q.scale)),
            (f"bf16 {name} T={t}", lambda x=x, w=w: F.linear(x, w)),
            (
                f"static {name} T={t}",
                lambda x=x, q=q, one=one: run_path(
                    Fp8Path.SCALED_MM_STATIC, x, q.weight, q.scale, input_scale=one
                ),
            ),
            (
                f"read {name} fp8 bytes",
                lambda words=words, sink=sink: read_once(words, sink, (1024, 8, 3, 8 * sms, False)),
            ),
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    args = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    profile_once(cases(args.cases, sms))
    return 0


def profile_once(todo: list[tuple[str, Callable[[], object]]]) -> None:
    """Runs every case once to warm up, then once more between ``cudaProfilerStart`` /
    ``cudaProfilerStop`` (each in an NVTX range of its name), so that Nsight Compute with
    ``--profile-from-start off`` profiles exactly those launches."""
    for _, fn in todo:
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in todo:
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled, in order:", ", ".join(name for name, _ in todo))


if __name__ == "__main__":
    raise SystemExit(main())
