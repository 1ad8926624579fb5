"""step_profile's split of a decode step: each kernel to the innermost range that launched it."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.gpu_e2e.step_profile import per_step, split_step

CPU, OTHER_THREAD = 1, 2


def _range(name: str, ts: float, dur: float, tid: int = CPU) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": f"mtpconv-step: {name}",
        "ts": ts,
        "dur": dur,
        "tid": tid,
    }


def _kernel(corr: int, launched: float, ts: float, dur: float, tid: int = CPU) -> list[dict[str, Any]]:
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launched, "dur": 1,
              "tid": tid, "args": {"correlation": corr}}  # fmt: skip
    kernel = {"ph": "X", "cat": "kernel", "name": f"k{corr}", "ts": ts, "dur": dur, "tid": 7,
              "args": {"correlation": corr}}  # fmt: skip
    return [launch, kernel]


def _trace() -> dict[str, Any]:
    events = [
        # prefill step: left out
        _range("target", 0, 50),
        *_kernel(1, 10, 20, 100),
        # decode step 1 (100-200) and 2 (200-300): target, then sample holding draft holding head
        _range("target", 100, 40),
        _range("sample", 140, 60),
        _range("draft", 150, 40),
        _range("head", 170, 10),
        *_kernel(2, 110, 120, 30),  # target
        *_kernel(3, 145, 160, 5),  # sample, outside draft
        *_kernel(4, 155, 170, 10),  # draft
        *_kernel(5, 175, 185, 4),  # head
        _range("target", 200, 40),
        _range("sample", 240, 60),
        _range("draft", 250, 40),
        *_kernel(6, 210, 215, 30),  # target
        *_kernel(7, 260, 262, 20),  # draft
        *_kernel(8, 265, 290, 5, tid=OTHER_THREAD),  # launched by no range: other
        {"ph": "X", "cat": "kernel", "name": "orphan", "ts": 299, "dur": 1, "tid": 7, "args": {}},
    ]
    return {"traceEvents": events}


def test_each_kernel_goes_to_the_innermost_range_that_launched_it() -> None:
    split = split_step(_trace())
    assert split["steps"] == 2
    assert split["window_us"] == 200  # second target's start to the last range's end
    assert split["gpu_us"] == {"target": 60, "draft": 30, "head": 4, "sample": 5, "other": 6}
    assert split["kernels"] == {"target": 2, "draft": 2, "head": 1, "sample": 1, "other": 2}
    # busy: union of the decode kernels (120-150, 160-165, 170-180, 185-189, 215-245, 262-282,
    # 290-295, 299-300)
    assert split["gpu_busy_us"] == pytest.approx(30 + 5 + 10 + 4 + 30 + 20 + 5 + 1)
    # CPU: each range less what is nested in it
    assert split["cpu_us"] == {"target": 80, "sample": 40, "draft": 70, "head": 10}


def test_per_step_in_milliseconds() -> None:
    doc = per_step(split_step(_trace()), tokens=9)
    assert doc["steps"] == 2 and doc["tokens_per_step"] == 4.0
    assert doc["wall_ms"] == pytest.approx(0.1)
    assert doc["gpu_ms"]["target"] == pytest.approx(0.03)
    assert doc["gpu_idle_ms"] == pytest.approx(0.1 - 0.105 / 2)


def test_a_trace_without_decode_steps_reports_nothing() -> None:
    split = split_step({"traceEvents": [_range("target", 0, 10), *_kernel(1, 1, 2, 3)]})
    assert split["steps"] == 0 and split["window_us"] == 0 and sum(split["gpu_us"].values()) == 0
