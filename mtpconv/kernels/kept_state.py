"""Device tensors the kernels keep between launches, valid wherever they are used.

The kernels keep initialized state on the device: split-K arrival counters, the barrier
slots and counters of the quantizers, constant rows of ones. Each starts as a fill
(zeros or ones). Made while a CUDA graph is being captured, a fill is only *recorded*: it
runs when that graph replays, not before. Cached and then used by an eager call or by
another graph, such state would be read uninitialized. vLLM's Model Runner V2 does exactly
this: it warms each batch size up on one stream and captures it on torch's side stream, so
the capture stream's first state is made inside the first capture and read by every graph
captured after it.

:func:`kept` is the one rule: state made outside a capture is cached under its key and
reused, by eager calls and captures alike (its fill has run); state asked for during a
capture that the cache cannot serve is made for that call alone, its fill recorded in the
graph being captured, and not cached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

State = TypeVar("State")


def capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream is capturing a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def kept(
    registry: dict[tuple[object, ...], State],
    key: tuple[object, ...],
    device: torch.device,
    make: Callable[[State | None], State],
    fits: Callable[[State], bool] = lambda _: True,
    superseded: list[State] | None = None,
) -> State:
    """``registry[key]`` where it exists and ``fits``, else ``make(old)`` (``old``: the entry it
    outgrew, or None). Made outside a capture it replaces the entry (the old one is appended to
    ``superseded``: a graph captured before may still use it); made during a capture it serves
    this call only."""
    state = registry.get(key)
    if state is not None and fits(state):
        return state
    fresh = make(state)
    if capturing(device):
        return fresh
    if state is not None and superseded is not None:
        superseded.append(state)
    registry[key] = fresh
    return fresh
