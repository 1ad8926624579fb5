"""A CUDA-graph check shared by the CUDA tests of kernels launched with PDL."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from mtpconv.kernels import pdl


def replays_match_eager(
    capture: Callable[[], list[torch.Tensor]],
    eager: Callable[[], list[torch.Tensor]],
    refresh: Callable[[], None],
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
    replays: int = 3,
) -> None:
    """``capture()`` captured in a CUDA graph with PDL in ``mode`` replays, after each
    ``refresh()`` of its inputs, to the bytes of ``eager()`` run without PDL (a missing wait
    would read the previous replay's data)."""
    monkeypatch.setenv(pdl.ENV, mode)
    capture()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = capture()
    for replay in range(replays):
        refresh()
        graph.replay()
        torch.cuda.synchronize()
        monkeypatch.setenv(pdl.ENV, "0")
        want = eager()
        monkeypatch.setenv(pdl.ENV, mode)
        for i, (a, b) in enumerate(zip(captured, want, strict=True)):
            assert torch.equal(a, b), (mode, replay, i)
