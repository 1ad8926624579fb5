"""FP8 routed experts of an MoE drafter.

Each expert's ``gate_proj``/``up_proj``/``down_proj`` is stored FP8 with its own
per-tensor scale (DESIGN §5): 0-d (older variants) or replicated into 128x128
blocks as ``weight_scale_inv`` (the standard variant, the layout vLLM's block
``Fp8MoEMethod`` loads). On CUDA, vLLM's own ``Fp8MoEMethod`` serves that format
(per-tensor scales, dynamic activations). On CPU, vLLM's FP8 MoE kernels need
AMX, so :class:`Fp8ExpertsLoopMethod` runs the routed experts one by one on the
same FP8 kernels as the drafter's linears (:mod:`mtpconv.vllm_plugin.kernels`):
weights stay FP8, nothing is widened at load. It loops over experts in Python,
which suits the CPU test deployments it exists for, not large serving.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase, FusedMoEQuantConfig
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.utils import set_weight_attrs
from vllm.platforms import current_platform

from mtpconv.errors import ManifestError
from mtpconv.formats.scale_layout import BLOCK, ScaleLayout, stored_scale_shape
from mtpconv.vllm_plugin.kernels import PreparedFp8
from mtpconv.vllm_plugin.quant import UNLOADED_SCALE, has_unloaded


def is_routed_experts(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` is vLLM's fused routed-experts module."""
    from vllm.model_executor.layers import fused_moe

    cls = getattr(fused_moe, "RoutedExperts", None) or getattr(fused_moe, "FusedMoE", None)
    return cls is not None and isinstance(layer, cls)


def fp8_experts_method(layer: Any, prefix: str, block: bool = False) -> QuantizeMethodBase:
    """The FP8 method for an MoE drafter's routed experts on this platform
    (``block``: scales stored as 128x128 ``weight_scale_inv``)."""
    if current_platform.is_cuda_alike():
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config

        method = Fp8Config(
            is_checkpoint_fp8_serialized=True,
            activation_scheme="dynamic",
            weight_block_size=[BLOCK, BLOCK] if block else None,
        ).get_quant_method(layer, prefix)
        assert method is not None
        return method
    return Fp8ExpertsLoopMethod(layer.moe_config, block=block)


class Fp8ExpertsLoopMethod(FusedMoEMethodBase):
    """FP8 routed experts (per-expert, per-projection scales), one expert at a time."""

    def __init__(self, moe: Any, block: bool = False) -> None:
        super().__init__(moe)
        self.block = block

    def create_weights(
        self,
        layer: Any,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        from vllm.model_executor.layers.fused_moe.routed_experts import FusedMoeWeightScaleSupported

        inter = intermediate_size_per_partition
        w13 = torch.nn.Parameter(
            torch.empty(num_experts, 2 * inter, hidden_size, dtype=torch.float8_e4m3fn), requires_grad=False
        )
        w2 = torch.nn.Parameter(
            torch.empty(num_experts, hidden_size, inter, dtype=torch.float8_e4m3fn), requires_grad=False
        )
        for name, p in (("w13_weight", w13), ("w2_weight", w2)):
            layer.register_parameter(name, p)
            set_weight_attrs(p, extra_weight_attrs)
        if self.block:
            # The per-tensor values replicated into 128x128 blocks (gate blocks, then up), as
            # quantize-mtp stores them.
            shapes: tuple[tuple[int, ...], tuple[int, ...]] = (
                stored_scale_shape(
                    ScaleLayout.BLOCK_128, (num_experts, 2 * inter, hidden_size), fused_halves=True
                ),
                stored_scale_shape(ScaleLayout.BLOCK_128, (num_experts, hidden_size, inter)),
            )
            names, kind = ("w13_weight_scale_inv", "w2_weight_scale_inv"), FusedMoeWeightScaleSupported.BLOCK
        else:
            # One scale per expert for gate (w1) and up (w3), one for down (w2).
            shapes = ((num_experts, 2), (num_experts,))
            names, kind = ("w13_weight_scale", "w2_weight_scale"), FusedMoeWeightScaleSupported.TENSOR
        for name, shape in zip(names, shapes, strict=True):
            p = torch.nn.Parameter(
                torch.full(shape, UNLOADED_SCALE, dtype=torch.float32), requires_grad=False
            )
            layer.register_parameter(name, p)
            set_weight_attrs(p, extra_weight_attrs)
            set_weight_attrs(p, {"quant_method": kind.value})

    def _scales(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Per expert: ``[E, 2]`` (gate, up) and ``[E]`` (down) per-tensor values."""
        if not self.block:
            return layer.w13_weight_scale.data, layer.w2_weight_scale.data
        s13, s2 = layer.w13_weight_scale_inv.data, layer.w2_weight_scale_inv.data
        half = s13.shape[1] // 2
        return torch.stack([s13[:, 0, 0], s13[:, half, 0]], dim=1), s2[:, 0, 0]

    def get_fused_moe_quant_config(self, layer: Any) -> FusedMoEQuantConfig | None:
        return FusedMoEQuantConfig.make()

    def process_weights_after_loading(self, layer: Any) -> None:
        s13, s2 = self._scales(layer)
        stored = [p.data for n, p in layer.named_parameters(recurse=False) if "_scale" in n]
        if any(has_unloaded(t) for t in stored):
            raise ManifestError(
                f"{getattr(layer, 'layer_name', 'experts')}: mtpconv.json lists the "
                "experts as FP8 but some have no weight_scale; re-run "
                "`mtpconv quantize-mtp`."
            )
        inter = layer.w2_weight.shape[-1]
        hidden = layer.w2_weight.shape[1]
        self.gate_up: list[PreparedFp8] = []
        self.down: list[PreparedFp8] = []
        for e in range(layer.w13_weight.shape[0]):
            rows13 = torch.repeat_interleave(s13[e], inter)
            self.gate_up.append(PreparedFp8(layer.w13_weight.data[e], rows13))
            self.down.append(PreparedFp8(layer.w2_weight.data[e], s2[e].reshape(1).expand(hidden)))
        # Keep one copy of the FP8 weights: the kernels' layout, stacked.
        for name, prepared in (("w13_weight", self.gate_up), ("w2_weight", self.down)):
            stacked = torch.stack([p.weight for p in prepared])
            for e, p in enumerate(prepared):
                p.weight = stacked[e]
            setattr(layer, name, torch.nn.Parameter(stacked, requires_grad=False))

    def apply(
        self,
        layer: Any,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        shared_experts: Any,
        shared_experts_input: torch.Tensor | None,
    ) -> torch.Tensor:
        # Without a modular kernel vLLM's runner adds the shared experts itself.
        del shared_experts, shared_experts_input
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        expert_map = getattr(layer, "expert_map", None)
        ids = topk_ids if expert_map is None else expert_map[topk_ids]
        inter = layer.w2_weight.shape[-1]
        for e in torch.unique(ids).tolist():
            if e < 0:
                continue
            tok, slot = (ids == e).nonzero(as_tuple=True)
            gate_up = self.gate_up[e].apply(x[tok])
            act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
            y = self.down[e].apply(act).to(torch.float32)
            out.index_add_(0, tok, y * topk_weights[tok, slot].to(torch.float32).unsqueeze(-1))
        return out.to(x.dtype)
