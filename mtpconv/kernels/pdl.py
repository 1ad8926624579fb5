"""Programmatic dependent launch (PDL) for the skinny GEMM and the grouped MoE kernel.

With PDL (NVIDIA sm_90 and newer, Triton's ``launch_pdl=True``) a kernel may be
launched while the one before it on the stream is still running; it waits
(``griddepcontrol.wait``) for that kernel's completion, memory included, before it
reads or writes anything, so it is correct after any kernel, ours or not, and in CUDA
graphs (which keep the programmatic edges). What it saves is the launch and the
ramp of the next kernel behind the tail of the previous one. A kernel lets its own
dependents launch (``griddepcontrol.launch_dependents``) right after its wait
(``early``) or after its main loop (``late``); a predecessor that never says so (a
torch kernel) lets them launch as its programs end.

``MTPCONV_PDL`` chooses: unset, ``0`` or ``off``: no PDL (the default: the drafter
step of docs/BENCHMARKS.md, issue 12, did not measurably gain, since most of its FP8
linears follow a torch kernel); ``1`` or ``early``; ``late``.
"""

from __future__ import annotations

import functools
import os
from enum import IntEnum

import torch

ENV = "MTPCONV_PDL"


class Pdl(IntEnum):
    """The kernels' ``PDL`` constexpr: where a kernel lets its dependents launch."""

    OFF = 0
    EARLY = 1  # right after the wait
    LATE = 2  # after the main loop, before the epilogue


_MODES = {"": Pdl.OFF, "0": Pdl.OFF, "off": Pdl.OFF, "1": Pdl.EARLY, "early": Pdl.EARLY, "late": Pdl.LATE}


@functools.lru_cache(maxsize=16)
def _hopper(index: int) -> bool:
    """NVIDIA sm_90 or newer (``griddepcontrol``); never a ROCm device."""
    return torch.version.hip is None and torch.cuda.get_device_capability(index) >= (9, 0)


def setting(device: torch.device) -> Pdl:
    """The PDL mode for launches on ``device``, read from ``MTPCONV_PDL`` on every call
    (a benchmark switches it between captures); OFF on CPUs and GPUs before sm_90."""
    value = os.environ.get(ENV, "").strip().lower()
    mode = _MODES.get(value)
    if mode is None:
        raise ValueError(f"{ENV}={value!r} is not one of 0, 1, early, late: set one of those or unset it")
    if mode is Pdl.OFF or device.type != "cuda" or not _hopper(device.index or 0):
        return Pdl.OFF
    return mode
