"""What the header-only commands cost on a checkpoint with as many tensors as a 397B release.

Builds (once, kept in ``--dir``) a Qwen3.5-MoE NVFP4 checkpoint shaped like
Qwen3.5-397B-A17B in names and counts: 60 target layers of 512 routed experts, one MTP
layer, 16 shards, ~372k tensors (tiny dimensions: the headers are real, the weights a
few MB). Then times, side by side in one run, the best of ``--repeat``:

  * ``python -c pass`` (starting bare Python),
  * ``mtpconv inspect`` of a tiny local checkpoint (the issue's "local checkpoint"),
  * ``mtpconv inspect``, ``mtpconv quantize-mtp --dry-run`` and ``mtpconv fix-exclusions
    --dry-run`` of the large one,

with each command's CPU seconds, and prints a Markdown table. ``--phases`` instead
times inspect's steps in this process on the large checkpoint: reading the headers with
CPython's cyclic collector on and off, then (collector off, as the commands run them)
the layout, the stock-vLLM view and the audit.

    python scripts/bench_inspect.py [--dir /tmp/mtpconv-bench-inspect] [--layers 60]
        [--experts 512] [--repeat 3] [--mtpconv mtpconv] [--phases]

``--mtpconv`` may name another checkout's entry (e.g. ``"python -m mtpconv"`` with its
``PYTHONPATH``) to compare two versions on the same files.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

from fixtures.checkpoints import Spec, write_checkpoint


def _timed(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one run of ``cmd``; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _best(cmd: list[str], repeat: int) -> tuple[float, float]:
    runs = [_timed(cmd) for _ in range(repeat)]
    return min(runs)


def _phases(large: Path, tensors: int) -> None:
    """inspect's steps, timed in this process (wall seconds, one run each)."""
    from mtpconv.checkpoint.index import load_checkpoint_files
    from mtpconv.layouts import detect_layout, module_of
    from mtpconv.quantconfig.audit import audit_quant_configs
    from mtpconv.quantconfig.documents import load_quant_configs
    from mtpconv.quantconfig.stock_view import source_view
    from mtpconv.weight_names import CheckpointModules

    def timed(step: Any) -> tuple[Any, float]:
        start = time.perf_counter()
        out = step()
        return out, time.perf_counter() - start

    rows = []
    with mock.patch("mtpconv.checkpoint.index.paused_gc", contextlib.nullcontext):
        _, with_gc = timed(lambda: load_checkpoint_files(large))
    rows.append(("read headers and index, collector on", with_gc))
    gc.collect()
    gc.disable()
    files, t = timed(lambda: load_checkpoint_files(large))
    rows.append(("read headers and index, collector off", t))
    configs = load_quant_configs(large)
    layout, t = timed(lambda: detect_layout(configs.config, files.tensors))
    rows.append(("find the drafter (detect_layout)", t))
    known, t = timed(lambda: CheckpointModules.of(files.tensors))
    rows.append(("the checkpoint's modules and linears", t))
    _, t = timed(lambda: source_view(configs, files.tensors, layout, known))
    rows.append(("what stock vLLM would read (declaration + verification)", t))
    drafter = {module_of(n) for n in layout.drafter_tensors}
    _, t = timed(lambda: audit_quant_configs(configs, known.linears, drafter, all_modules=known.modules))
    rows.append(("the quant-config audit", t))
    gc.enable()
    print(f"\n{tensors:,} tensors; in-process, one run each\n")
    print("| step | wall s |")
    print("|---|---|")
    for label, sec in rows:
        print(f"| {label} | {sec:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/mtpconv-bench-inspect"))
    ap.add_argument("--layers", type=int, default=60)
    ap.add_argument("--experts", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mtpconv", default="mtpconv", help="the command to time (default: mtpconv)")
    ap.add_argument("--phases", action="store_true", help="time inspect's steps in this process")
    args = ap.parse_args()
    large = args.dir / f"qwen3.5-moe-nvfp4-{args.layers}x{args.experts}"
    tiny = args.dir / "tiny"
    if not (large / "config.json").is_file():
        print(f"building {large} (once) ...", file=sys.stderr, flush=True)
        spec = Spec(
            family="qwen3_5_moe",
            hidden=16,
            intermediate=16,
            head_dim=8,
            vocab=64,
            experts=args.experts,
            layers=args.layers,
            quant="nvfp4",
            shards=16,
        )
        write_checkpoint(large, spec)
    if not (tiny / "config.json").is_file():
        write_checkpoint(tiny, Spec(family="qwen3_5_moe", quant="nvfp4"))
    tensors = len(json.loads((large / "model.safetensors.index.json").read_text())["weight_map"])
    if args.phases:
        _phases(large, tensors)
        return
    tool = shlex.split(args.mtpconv)
    out = args.dir / "out"
    cases = [
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("inspect (tiny)", [*tool, "inspect", str(tiny)]),
        ("inspect", [*tool, "inspect", str(large)]),
        ("quantize-mtp --dry-run", [*tool, "quantize-mtp", str(large), str(out / "v"), "--dry-run"]),
        ("fix-exclusions --dry-run", [*tool, "fix-exclusions", str(large), str(out / "f"), "--dry-run"]),
    ]
    rows = []
    for label, cmd in cases:
        wall, cpu = _best(cmd, args.repeat)
        rows.append((label, wall, cpu))
        print(f"{label}: {wall:.2f} s wall, {cpu:.2f} CPU-s", file=sys.stderr, flush=True)
    bare = rows[0][1]
    print(
        f"\n{args.layers} layers x {args.experts} experts, {tensors:,} tensors; `{args.mtpconv}`; "
        f"best of {args.repeat}; cores {len(os.sched_getaffinity(0))}\n"
    )
    print("| command | wall s | above bare Python s | CPU s |")
    print("|---|---|---|---|")
    for label, wall, cpu in rows:
        print(f"| {label} | {wall:.2f} | {wall - bare:.2f} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
