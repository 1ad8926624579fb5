"""kept_state.kept: state made outside a CUDA-graph capture is cached and reused; state asked
for during a capture that the cache cannot serve serves that call alone (its fill is only
recorded in that graph, so no other graph or eager call may read it)."""

from __future__ import annotations

import pytest
import torch

from mtpconv.kernels import kept_state

CPU = torch.device("cpu")


def _zeros(n: int):  # type: ignore[no-untyped-def]
    def make(old: torch.Tensor | None) -> torch.Tensor:
        return torch.zeros(max(n, old.numel() if old is not None else 0))

    return make


def test_outside_a_capture_state_is_cached_grown_and_the_old_kept() -> None:
    registry: dict[tuple[object, ...], torch.Tensor] = {}
    superseded: list[torch.Tensor] = []
    first = kept_state.kept(registry, ("k",), CPU, _zeros(4), lambda t: t.numel() >= 4, superseded)
    assert kept_state.kept(registry, ("k",), CPU, _zeros(2), lambda t: t.numel() >= 2, superseded) is first
    grown = kept_state.kept(registry, ("k",), CPU, _zeros(8), lambda t: t.numel() >= 8, superseded)
    assert grown.numel() == 8 and registry[("k",)] is grown and superseded == [first]
    assert kept_state.kept(registry, ("other",), CPU, _zeros(1)) is not grown


def test_during_a_capture_a_miss_serves_that_call_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    registry: dict[tuple[object, ...], torch.Tensor] = {}
    monkeypatch.setattr(kept_state, "capturing", lambda device: True)
    a = kept_state.kept(registry, ("k",), CPU, _zeros(4))
    b = kept_state.kept(registry, ("k",), CPU, _zeros(4))
    assert a is not b and registry == {}  # each captured call records its own fill
    monkeypatch.setattr(kept_state, "capturing", lambda device: False)
    eager = kept_state.kept(registry, ("k",), CPU, _zeros(4))
    assert registry == {("k",): eager}
    monkeypatch.setattr(kept_state, "capturing", lambda device: True)
    # made eagerly (its fill has run): captures reuse it; one it does not fit is made apart
    assert kept_state.kept(registry, ("k",), CPU, _zeros(4), lambda t: t.numel() >= 4) is eager
    bigger = kept_state.kept(registry, ("k",), CPU, _zeros(16), lambda t: t.numel() >= 16, [])
    assert bigger.numel() == 16 and registry[("k",)] is eager


def test_no_cuda_device_is_never_capturing() -> None:
    assert kept_state.capturing(CPU) is False
