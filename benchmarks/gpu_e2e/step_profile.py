#!/usr/bin/env python
"""Where one speculative decode step's time goes in vLLM: the target, the drafter, its head.

Serves one ``mtpconv eval`` row (the same model, speculation and plugin switch) in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), warms it up, then decodes one prompt at batch 1
under ``torch.profiler`` and splits the step. Ranges are put around the runner's methods:

- ``target``: ``execute_model`` (input preparation and the target's forward);
- ``draft``: the drafter's proposal (V1 ``propose_draft_token_ids``, V2 ``speculator.propose``);
- ``head``: the drafter's ``compute_logits`` where the proposer calls it outside a CUDA graph
  (inside one, its kernels count as ``draft``);
- ``sample``: the rest of ``sample_tokens`` (sampling, rejection).

Each GPU kernel is given to the innermost range whose CPU span holds the call that launched it
(the profiler's correlation id; a CUDA graph's kernels follow its launch). Reported per step:
wall time (the window over the steps taken), GPU kernel time per range, and the time the GPU
sat idle. Writes ``OUT`` (JSON) and prints a table.

    python -m benchmarks.gpu_e2e.step_profile MODEL --row variant-plugin --out OUT.json \\
        [-k 3] [--tokens 128] [--engine-arg K=V ...] [--trace TRACE.json.gz]
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mtpconv.commands.evaluate import parse_engine_args
from mtpconv.evaluation.rows import BUILTIN_PROMPTS, Row, RowJob
from mtpconv.evaluation.runner import row_environment
from mtpconv.evaluation.worker import device_name, engine_arguments, model_runner

RANGES = ("target", "draft", "head", "sample")
_PREFIX = "mtpconv-step: "
# Where the runner keeps the drafter's proposal: V1 a method of the runner, V2 its speculator.
_PROPOSERS = (("", "propose_draft_token_ids"), ("speculator", "propose"))


def _timed(name: str, fn: Any) -> Any:
    from torch.profiler import record_function

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with record_function(_PREFIX + name):
            return fn(*args, **kwargs)

    return wrapper


def install_ranges(worker: Any) -> list[str]:
    """Wrap the runner's step methods in named profiler ranges; the names of what was wrapped."""
    runner = worker.model_runner
    done = []
    for attr, name in (("execute_model", "target"), ("sample_tokens", "sample")):
        setattr(runner, attr, _timed(name, getattr(runner, attr)))
        done.append(name)
    for holder_attr, method in _PROPOSERS:
        holder = getattr(runner, holder_attr) if holder_attr else runner
        if holder is not None and hasattr(holder, method):
            setattr(holder, method, _timed("draft", getattr(holder, method)))
            done.append("draft")
            break
    for holder_attr in ("drafter", "speculator"):
        model = getattr(getattr(runner, holder_attr, None), "model", None)
        if model is not None and hasattr(model, "compute_logits"):
            model.compute_logits = _timed("head", model.compute_logits)
            done.append("head")
            break
    return done


def _events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]


def _union_us(spans: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def split_step(trace: dict[str, Any]) -> dict[str, Any]:
    """Per-range GPU kernel time, kernel counts and the window, from a Chrome trace of the steps.

    The first ``target`` range is the prompt's prefill: the window starts at the second one, and
    what was launched before it is left out. CPU time is each range's own, less the ranges
    nested in it (``sample`` holds ``draft``, which holds ``head``).
    """
    events = _events(trace)
    spans = sorted(
        (e["ts"], e["ts"] + e["dur"], e["tid"], e["name"][len(_PREFIX) :])
        for e in events
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(_PREFIX)
    )
    targets = [s for s in spans if s[3] == "target"]
    start = targets[1][0] if len(targets) > 1 else float("inf")
    ranges = [s for s in spans if s[0] >= start]
    launches = {
        e["args"]["correlation"]: (e["tid"], e["ts"])
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    gpu_us = dict.fromkeys((*RANGES, "other"), 0.0)
    counts = dict.fromkeys((*RANGES, "other"), 0)
    busy: list[tuple[float, float]] = []
    for k in (e for e in events if e.get("cat") == "kernel"):
        tid, ts = launches.get(k.get("args", {}).get("correlation"), (None, k["ts"]))
        if ts < start:
            continue
        holding = [r for r in ranges if r[2] == tid and r[0] <= ts <= r[1]]
        owner = min(holding, key=lambda r: r[1] - r[0])[3] if holding else "other"
        gpu_us[owner] += k["dur"]
        counts[owner] += 1
        busy.append((k["ts"], k["ts"] + k["dur"]))
    cpu_us = dict.fromkeys(RANGES, 0.0)
    for lo, hi, tid, name in ranges:
        nested = [r for r in ranges if r[2] == tid and lo <= r[0] and r[1] <= hi and r != (lo, hi, tid, name)]
        inner = [r for r in nested if not any(o is not r and o[0] <= r[0] and r[1] <= o[1] for o in nested)]
        cpu_us[name] += (hi - lo) - sum(r[1] - r[0] for r in inner)
    return {
        "steps": sum(1 for r in ranges if r[3] == "target"),
        "window_us": (max(r[1] for r in ranges) - start) if ranges else 0.0,
        "gpu_us": gpu_us,
        "kernels": counts,
        "gpu_busy_us": _union_us(busy),
        "cpu_us": cpu_us,
    }


def per_step(split: dict[str, Any], tokens: int) -> dict[str, Any]:
    """``split_step``'s sums as milliseconds per decode step, with the tokens each step served
    (``tokens`` is the request's output; the prefill step served the first)."""
    steps = max(split["steps"], 1)
    ms = {name: us / steps / 1000 for name, us in split["gpu_us"].items()}
    wall = split["window_us"] / steps / 1000
    busy = split["gpu_busy_us"] / steps / 1000
    return {
        "steps": split["steps"],
        "tokens_per_step": (tokens - 1) / steps,
        "wall_ms": wall,
        "gpu_ms": ms,
        "gpu_busy_ms": busy,
        "gpu_idle_ms": max(wall - busy, 0.0),
        "cpu_ms": {name: us / steps / 1000 for name, us in split["cpu_us"].items()},
        "kernels_per_step": {name: n / steps for name, n in split["kernels"].items()},
    }


def profile(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import vllm
    from torch.profiler import ProfilerActivity
    from vllm import LLM, SamplingParams

    row = Row(args.row)
    prompt = BUILTIN_PROMPTS[0]
    job = RowJob(
        row, args.model, [{"prompt": prompt}], [1], args.tokens, args.k, parse_engine_args(args.engine_arg)
    )
    # the eval row's engine, less its statistics logging (the profiled step does without it)
    llm = LLM(**{**engine_arguments(job), "disable_log_stats": True})
    wrapped = llm.collective_rpc(install_ranges)[0]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate([prompt], greedy, use_tqdm=False)  # warm-up: compiled, captured, cached
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch.profiler.profile(activities=activities) as prof:
        out = llm.generate([prompt], greedy, use_tqdm=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text(encoding="utf-8"))
        if args.trace:
            with path.open("rb") as src, gzip.open(args.trace, "wb") as dst:
                shutil.copyfileobj(src, dst)
    tokens = len(out[0].outputs[0].token_ids)
    return {
        "row": row.value,
        "model": args.model,
        "vllm_version": vllm.__version__,
        "device": device_name(),
        "model_runner": model_runner(llm),
        "num_speculative_tokens": args.k if row.speculative else 0,
        "ranges": wrapped,
        "tokens": tokens,
        **per_step(split_step(trace), tokens),
    }


def render(doc: dict[str, Any]) -> str:
    gpu = doc["gpu_ms"]
    lines = [
        f"{doc['row']} on {doc['device']} (vLLM {doc['vllm_version']}, {doc['model_runner']}): "
        f"{doc['steps']} decode steps, {doc['tokens_per_step']:.2f} tokens a step",
        f"  wall {doc['wall_ms']:.3f} ms a step; GPU busy {doc['gpu_busy_ms']:.3f}, "
        f"idle {doc['gpu_idle_ms']:.3f}",
        "  GPU ms a step: " + ", ".join(f"{name} {gpu[name]:.3f}" for name in (*RANGES, "other")),
        "  CPU ms a step: " + ", ".join(f"{name} {ms:.3f}" for name, ms in doc["cpu_ms"].items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="the checkpoint the row serves (the source, or the variant)")
    parser.add_argument("--row", choices=[r.value for r in Row], required=True)
    parser.add_argument("--out", type=Path, required=True, help="where the JSON goes")
    parser.add_argument("-k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--tokens", type=int, default=128, help="tokens decoded under the profiler")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="K=V")
    parser.add_argument("--trace", type=Path, help="also keep the Chrome trace (gzip)")
    args = parser.parse_args(argv)
    # The engine in this process (so the profiler sees its kernels), the row's plugin switch, and
    # vLLM's own switches read once at import.
    os.environ.update(row_environment(Row(args.row), dict(os.environ)))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    doc = profile(args)
    args.out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
