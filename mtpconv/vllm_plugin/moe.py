"""FP8 routed experts of an MoE drafter (placeholder until implemented)."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase


def is_routed_experts(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` is vLLM's fused routed-experts module."""
    from vllm.model_executor.layers import fused_moe

    cls = getattr(fused_moe, "RoutedExperts", None) or getattr(fused_moe, "FusedMoE", None)
    return cls is not None and isinstance(layer, cls)


def fp8_experts_method(layer: torch.nn.Module) -> QuantizeMethodBase:
    """The FP8 method for an MoE drafter's routed experts."""
    raise NotImplementedError("FP8 routed experts in the drafter are not supported yet")
