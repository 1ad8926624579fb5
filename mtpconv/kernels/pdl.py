"""Programmatic dependent launch (PDL) for the Triton kernels of a drafter step.

With PDL (NVIDIA sm_90 and newer, Triton's ``launch_pdl=True``) a kernel may be
launched while the one before it on the stream is still running; it waits
(``griddepcontrol.wait``) for that kernel's completion, memory included, before it
reads or writes anything, so it is correct after any kernel, ours or not, and in CUDA
graphs (which keep the programmatic edges). What it saves is the launch and the
ramp of the next kernel behind the tail of the previous one. A kernel lets its own
dependents launch (``griddepcontrol.launch_dependents``) right after its wait
(``early``) or after its main loop (``late``); a predecessor that never says so (a
torch or cuBLAS kernel) lets them launch as its programs end.

Weight kernels (the skinny GEMM, the GEMV, the grouped MoE kernel) take the mode as set.
The producers (:mod:`mtpconv.kernels.triton_quant`, ``triton_quant_tensor``,
``triton_glue``: short kernels that read no weights and write the next linear's input)
take PDL whenever it is on, and let their dependents launch right after their wait.

``MTPCONV_PDL`` chooses: ``0`` or ``off``: no PDL; ``1`` or ``early``; ``late``. Unset:
``late`` where it was measured (Triton 3.6 or newer, CUDA 12.4 or newer for programmatic
edges in captured graphs; docs/BENCHMARKS.md, issue 12, eleventh session: the drafter step
gained once the producers before its linears were our kernels too), else off.
"""

from __future__ import annotations

import functools
import os
from enum import IntEnum

import torch

from mtpconv.versions import release

ENV = "MTPCONV_PDL"


class Pdl(IntEnum):
    """The kernels' ``PDL`` constexpr: where a kernel lets its dependents launch."""

    OFF = 0
    EARLY = 1  # right after the wait
    LATE = 2  # after the main loop, before the epilogue


_MODES = {"0": Pdl.OFF, "off": Pdl.OFF, "1": Pdl.EARLY, "early": Pdl.EARLY, "late": Pdl.LATE}
DEFAULT = Pdl.LATE  # where default_on() holds


@functools.lru_cache(maxsize=1)
def default_on() -> bool:
    """Whether unset means ``late``: Triton >= 3.6 (measured) and CUDA >= 12.4 (PDL edges in
    captured graphs); the GPU itself is checked per launch (:func:`setting`)."""
    try:
        import triton
    except ImportError:
        return False
    triton_at, cuda_at = release(triton.__version__), release(torch.version.cuda)
    return triton_at is not None and triton_at >= (3, 6) and cuda_at is not None and cuda_at >= (12, 4)


@functools.lru_cache(maxsize=16)
def hopper(index: int) -> bool:
    """NVIDIA sm_90 or newer (``griddepcontrol``); never a ROCm device."""
    return torch.version.hip is None and torch.cuda.get_device_capability(index) >= (9, 0)


def setting(device: torch.device) -> Pdl:
    """The PDL mode for launches on ``device``, read from ``MTPCONV_PDL`` on every call
    (a benchmark switches it between captures); OFF on CPUs and GPUs before sm_90."""
    value = os.environ.get(ENV, "").strip().lower()
    if value:
        mode = _MODES.get(value)
        if mode is None:
            names = ", ".join(_MODES)
            raise ValueError(f"{ENV}={value!r} is not one of {names}: set one of those or unset it")
    else:
        mode = DEFAULT if default_on() else Pdl.OFF
    if mode is Pdl.OFF or device.type != "cuda" or not hopper(device.index or 0):
        return Pdl.OFF
    return mode


def launch(device: torch.device) -> dict[str, int | bool]:
    """A weight kernel's launch arguments: the ``PDL`` constexpr and Triton's ``launch_pdl``."""
    mode = setting(device)
    return {"PDL": mode.value, "launch_pdl": mode is not Pdl.OFF}


def producer_launch(device: torch.device) -> dict[str, int | bool]:
    """A producer's launch arguments: with PDL on in any mode, it waits for the previous
    kernel and lets its dependents launch at once (all its programs are resident by then,
    so a barrier among them still completes); off stays off."""
    on = setting(device) is not Pdl.OFF
    return {"PDL": Pdl.EARLY.value if on else Pdl.OFF.value, "launch_pdl": on}
