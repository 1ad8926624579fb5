"""Timing a CUDA graph's replays, and the copy bandwidth the step's reads are held against."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from typing import Any

import torch

# How a graph's replays are timed: "single", each replay launched on an idle GPU and waited
# for (the default, every session's figures; the host's graph launch may fall inside each
# sample), or "queued", each replay queued behind the one before while the GPU runs (as a
# decode loop replays its graphs). Measured side by side: single was 0.3-6.4 us slower on
# every 32k-head step.
TIMINGS = ("queued", "single")
TIMING = "single"


def time_graph(fn: Callable[[], Any], reps: int, replays: int = 30) -> float:
    """Median microseconds of one ``fn`` call: ``reps`` calls captured in one graph, timed
    the way ``--timing`` says (:func:`graph_times`)."""
    return chosen(graph_times(fn, reps, replays))


def chosen(times: tuple[float, float]) -> float:
    """The one of :func:`graph_times`' ``(queued, single)`` that ``--timing`` picks."""
    return times[0] if TIMING == "queued" else times[1]


def graph_times(fn: Callable[[], Any], reps: int, replays: int = 30) -> tuple[float, float]:
    """Median microseconds of one ``fn`` call (``reps`` calls captured in one graph), from the
    same graph timed both ways of :data:`TIMINGS`: ``(queued, single)``."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    single = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        single.append(a.elapsed_time(b) * 1000.0 / reps)
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
    graph.replay()  # untimed: the GPU is busy while the timed replays queue behind it
    marks[0].record()
    for i in range(replays):
        graph.replay()
        marks[i + 1].record()
    marks[-1].synchronize()
    queued = [marks[i].elapsed_time(marks[i + 1]) * 1000.0 / reps for i in range(replays)]
    del graph
    return statistics.median(queued), statistics.median(single)


def copy_bandwidth(dev: torch.device) -> float:
    """Device-to-device copy, bytes read + written per second (TB/s), eager, median of 10."""
    n = 2 * 2**30
    src = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return 2 * n / statistics.median(times) / 1e12


def time_configs(
    cfgs: list[Any], run: Callable[[Any], None], calls: int, label: str
) -> list[tuple[float, Any]]:
    """``(us, config)`` per configuration, in order: ``run(cfg)`` makes ``calls`` launches
    (over weight copies or id sets rotated so nothing stays in L2), timed in a CUDA graph.
    A configuration that fails is reported and left out."""
    res = []
    for cfg in cfgs:
        try:
            us = time_graph(functools.partial(run, cfg), reps=1, replays=15) / calls
        except Exception as exc:  # report and go on
            print(f"  sweep {label} {cfg} FAILED: {exc!r}"[:300], flush=True)
            continue
        res.append((us, cfg))
    return res
