"""vLLM plugin that serves ``-mtpfp8`` variants (DESIGN §6).

vLLM calls :func:`register` through the ``vllm.general_plugins`` entry point in
every process it starts. It replaces vLLM's MTP drafter classes of the Qwen3.5 /
Qwen3-Next family and MiMo with ours: on a checkpoint without ``mtpconv.json`` they are
vLLM's own classes; with the manifest they build FP8 drafter linears, the
truncated draft head and a stage-local forward.

Nothing here imports vLLM at module import time: ``pip install mtpconv`` without
vLLM must keep working, and vLLM imports this module in processes that may never
build a model.

:func:`register` also defines the custom ops ``torch.ops.mtpconv.fp8_linear`` and
``torch.ops.mtpconv.fp8_mlp`` (``mtpconv.kernels.op``; device-generic, so on CPU too).
vLLM's AOT compile cache restores compiled graphs at a model's first forward without
running any of our Python first, so a restored graph that names an op needs it defined
by then; plugin loading is the earliest point we get, in every vLLM process.
"""

from __future__ import annotations

import os

PLUGIN_NAME = "mtpconv"

# architecture name -> "module:Class" (lazy: vLLM imports it only when building one)
DRAFTER_CLASSES: dict[str, str] = {
    "Qwen3_5MTP": "mtpconv.vllm_plugin.qwen3_5:MtpconvQwen3_5MTP",
    "Qwen3_5MoeMTP": "mtpconv.vllm_plugin.qwen3_5:MtpconvQwen3_5MoeMTP",
    "Qwen3NextMTP": "mtpconv.vllm_plugin.qwen3_next:MtpconvQwen3NextMTP",
    "MiMoMTPModel": "mtpconv.vllm_plugin.mimo:MtpconvMiMoMTP",
}

_registered = False


def _allowed_by_env() -> bool:
    """vLLM's ``VLLM_PLUGINS`` allowlist (comma-separated); unset allows all."""
    raw = os.environ.get("VLLM_PLUGINS")
    if raw is None:
        return True
    return PLUGIN_NAME in [name.strip() for name in raw.split(",")]


def register() -> None:
    """Register our drafter classes with vLLM's model registry (idempotent).

    Defines ``torch.ops.mtpconv.fp8_linear`` and ``torch.ops.mtpconv.fp8_mlp`` first. A
    no-op when ``VLLM_PLUGINS`` leaves us out; without vLLM only the ops are defined.
    """
    global _registered
    if _registered or not _allowed_by_env():
        return
    # Importing the module runs its torch.library definitions (once per process).
    import mtpconv.kernels.op  # noqa: F401

    try:
        from vllm import ModelRegistry
        from vllm.logger import init_logger
    except ImportError:
        return
    for arch, target in DRAFTER_CLASSES.items():
        ModelRegistry.register_model(arch, target)
    _registered = True
    # Under the "vllm." namespace so that vLLM's own log configuration shows it.
    init_logger("vllm.plugins.mtpconv").info(
        "mtpconv: vLLM MTP drafters %s now served by mtpconv.vllm_plugin", ", ".join(DRAFTER_CLASSES)
    )
