"""Which quant method and kernel vLLM built for each drafter module (runs inside vLLM's worker).

:func:`describe_drafter` is handed to ``LLM.collective_rpc``: it receives vLLM's worker,
finds the drafter model (``model_runner.drafter`` in the V1 runners,
``model_runner.speculator`` in Model Runner V2) and reports, per module kind (the
module's name with layer and expert numbers folded), the quant method class, the
kernel object that method chose, the weight dtype and how many modules share them.
It reads only attributes; it never runs a module.
"""

from __future__ import annotations

import re
from typing import Any

# Attributes through which vLLM's linear / MoE methods (and the plugin) keep the kernel they
# chose at load time, most specific first.
_KERNEL_ATTRIBUTES = (
    "kernel",
    "fp8_linear",
    "w8a8_block_fp8_linear",
    "moe_kernel",
    "moe_mk",
    "fused_experts",
)
_WEIGHT_ATTRIBUTES = ("weight", "w13_weight", "w2_weight", "qweight", "weight_packed")
_NUMBER = re.compile(r"(^|\.)\d+(?=\.|$)")


def module_kind(name: str) -> str:
    """``model.layers.3.mlp.experts.17.down_proj`` -> ``model.layers.mlp.experts.down_proj``."""
    return _NUMBER.sub("", name).lstrip(".")


def _kernel_name(method: Any, module: Any) -> str:
    mtpconv = getattr(module, "mtpconv_fp8", None)
    if mtpconv is not None and getattr(mtpconv, "kernel", None):
        return f"mtpconv:{mtpconv.kernel}"
    for attr in _KERNEL_ATTRIBUTES:
        kernel = getattr(method, attr, None)
        if kernel is None or isinstance(kernel, (bool, int, float, str)):
            continue
        inner = getattr(kernel, "fused_experts", None)  # a modular MoE kernel: name its experts
        return type(inner if inner is not None else kernel).__name__
    return "-"


def _weight_dtype(module: Any) -> str:
    import torch

    for attr in _WEIGHT_ATTRIBUTES:
        w = getattr(module, attr, None)
        if isinstance(w, torch.Tensor):
            return str(w.dtype).replace("torch.", "")
    return "-"


def describe_model(model: Any) -> dict[str, dict[str, Any]]:
    """``kind -> {method, kernel, dtype, count}`` for every module holding a weight."""
    import torch

    kinds: dict[str, dict[str, Any]] = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method_name, kernel = type(method).__name__, _kernel_name(method, module)
        elif type(module) is torch.nn.Linear:
            method_name, kernel = "torch.nn.Linear", "torch"
        else:
            continue
        dtype = _weight_dtype(module)
        if dtype == "-" and method_name.endswith("KVCacheMethod"):
            continue  # the attention's KV-cache scale holder, not a weight
        entry = kinds.setdefault(
            module_kind(name), {"method": method_name, "kernel": kernel, "dtype": dtype, "count": 0}
        )
        entry["count"] += 1
    return kinds


def _drafter(worker: Any) -> Any:
    runner = worker.model_runner
    for attr in ("drafter", "speculator"):
        holder = getattr(runner, attr, None)
        model = getattr(holder, "model", None)
        if model is not None:
            return model
    return None


def describe_drafter(worker: Any) -> dict[str, Any]:
    """The drafter's class and :func:`describe_model` of it (``None`` without speculation)."""
    model = _drafter(worker)
    if model is None:
        return {"class": None, "modules": {}}
    cls = type(model)
    return {"class": f"{cls.__module__}.{cls.__name__}", "modules": describe_model(model)}
