"""vLLM quantization config and methods for the drafter of a ``-mtpfp8`` variant.

The drafter is built with the target's ``vllm_config`` and hence the target's
quant config (DESIGN §6). :class:`DrafterQuantConfig` wraps it: drafter linears
listed in the manifest get :class:`Fp8DrafterLinearMethod` (FP8 weight, one
float32 scale per fused shard, dynamic activations), everything else is
answered by the target's config exactly as stock vLLM would.
:class:`DraftHeadQuantConfig` gives the FP8 draft head (a ``ParallelLMHead``,
which vLLM's ``Fp8Config`` does not handle) its own method.

We do not use vLLM's ``Fp8LinearMethod``: on CPUs without AMX it cannot load
fused modules with per-shard scales and then upcasts the whole weight on every
call (DESIGN §6). Our methods keep the weight FP8 and never widen it at load.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.linear import (
    LinearBase,
    LinearMethodBase,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization.base_config import (
    QuantizationConfig,
    QuantizeMethodBase,
)
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.parameter import (
    ChannelQuantScaleParameter,
    ModelWeightParameter,
    PerTensorScaleParameter,
)
from vllm.model_executor.utils import set_weight_attrs

from mtpconv.errors import ManifestError
from mtpconv.vllm_plugin.kernels import PreparedFp8, row_scales

NAME = "mtpconv_fp8"
# What a scale parameter holds until the checkpoint's value is loaded into it.
UNLOADED_SCALE = torch.finfo(torch.float32).min


def has_unloaded(scale: torch.Tensor) -> bool:
    """Whether some value of ``scale`` was never loaded from the checkpoint."""
    return bool((scale == UNLOADED_SCALE).any())


def _mark_weight_loader_v2(cls: type) -> type:
    """Let vLLM's linear layers load our parameters with their v2 loaders."""
    from vllm.model_executor.layers import linear

    register = getattr(linear, "register_weight_loader_v2_supported_method", None)
    if register is not None:
        register(cls)
    elif cls.__name__ not in linear.WEIGHT_LOADER_V2_SUPPORTED:
        linear.WEIGHT_LOADER_V2_SUPPORTED.append(cls.__name__)
    return cls


def _check_scales_loaded(layer: Any, scale: torch.Tensor) -> None:
    if has_unloaded(scale):
        prefix = getattr(layer, "prefix", type(layer).__name__)
        raise ManifestError(
            f"{prefix}: mtpconv.json lists it as FP8 but the checkpoint has no "
            "weight_scale for it; re-run `mtpconv quantize-mtp`."
        )


def _prepare(layer: Any, rows: torch.Tensor) -> None:
    """Put ``layer``'s FP8 weight, with one scale per output row, in its kernel's layout; the
    layer keeps exactly one copy of the FP8 weight: that layout."""
    prepared = PreparedFp8(layer.weight.data, rows)
    setattr(layer, "mtpconv_fp8", prepared)  # noqa: B010  (not a Module attribute)
    layer.weight = torch.nn.Parameter(prepared.weight, requires_grad=False)


def _kernel_of(layer: Any) -> PreparedFp8:
    prepared: PreparedFp8 = layer.mtpconv_fp8
    return prepared


@_mark_weight_loader_v2
class Fp8DrafterLinearMethod(LinearMethodBase):
    """FP8 e4m3 weight, dynamic activations; the scale as stored: one per output
    channel (``weight_scale [out]``, the standard variant; ``[out, 1]`` from a
    compressed-tensors source) or one per fused shard."""

    def __init__(self, per_channel: bool = False, column: bool = False) -> None:
        super().__init__()
        self.per_channel = per_channel or column
        self.column = column

    def create_weights(
        self,
        layer: Any,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        loader = extra_weight_attrs.get("weight_loader")
        layer.logical_widths = list(output_partition_sizes)
        layer.orig_dtype = params_dtype
        weight = ModelWeightParameter(
            data=torch.empty(
                sum(output_partition_sizes), input_size_per_partition, dtype=torch.float8_e4m3fn
            ),
            input_dim=1,
            output_dim=0,
            weight_loader=loader,
        )
        layer.register_parameter("weight", weight)
        scale: torch.nn.Parameter
        if self.per_channel:
            scale = ChannelQuantScaleParameter(
                data=torch.full(
                    (sum(output_partition_sizes), *((1,) if self.column else ())),
                    UNLOADED_SCALE,
                    dtype=torch.float32,
                ),
                output_dim=0,
                weight_loader=loader,
            )
        else:
            scale = PerTensorScaleParameter(
                data=torch.full((len(output_partition_sizes),), UNLOADED_SCALE, dtype=torch.float32),
                weight_loader=loader,
            )
            set_weight_attrs(scale, {"scale_type": "weight_scale"})
        layer.register_parameter("weight_scale", scale)

    def process_weights_after_loading(self, layer: Any) -> None:
        _check_scales_loaded(layer, layer.weight_scale.data)
        if self.per_channel:
            rows = layer.weight_scale.data.to(torch.float32).reshape(-1)
        else:
            rows = row_scales(layer.weight_scale.data, layer.logical_widths)
        _prepare(layer, rows)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return _kernel_of(layer).apply(x, bias)


class Fp8DraftHeadMethod(QuantizeMethodBase):
    """FP8 truncated draft head: FP8 rows, one per-tensor scale, dynamic activations."""

    def create_weights(
        self,
        layer: Any,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        weight = torch.nn.Parameter(
            torch.zeros(sum(output_partition_sizes), input_size_per_partition, dtype=torch.float8_e4m3fn),
            requires_grad=False,
        )
        set_weight_attrs(weight, {"input_dim": 1, "output_dim": 0})
        set_weight_attrs(weight, extra_weight_attrs)
        layer.register_parameter("weight", weight)
        # No output_dim: vLLM's vocab loader copies it whole onto every rank.
        scale = torch.nn.Parameter(torch.full((1,), UNLOADED_SCALE, dtype=torch.float32), requires_grad=False)
        set_weight_attrs(scale, extra_weight_attrs)
        layer.register_parameter("weight_scale", scale)

    def process_weights_after_loading(self, layer: Any) -> None:
        _check_scales_loaded(layer, layer.weight_scale.data)
        n = layer.weight.shape[0]
        _prepare(layer, layer.weight_scale.data.reshape(1).expand(n))

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return _kernel_of(layer).apply(x, bias)


def checkpoint_names(prefix: str, packed: dict[str, list[str]]) -> list[str]:
    """Checkpoint module names (``mtp.…``) behind a vLLM module prefix.

    ``mtp.layers.0.self_attn.qkv_proj`` -> the ``q_proj``, ``k_proj``, ``v_proj``
    names; a prefix outside the drafter gives ``[]``.
    """
    if prefix.startswith("mtp."):
        name = prefix
    else:
        at = prefix.find(".mtp.")
        if at < 0:
            return []
        name = prefix[at + 1 :]
    head, _, last = name.rpartition(".")
    if last in packed:
        return [f"{head}.{part}" for part in packed[last]]
    return [name]


class DrafterQuantConfig(QuantizationConfig):
    """FP8 for the manifest's drafter linears; the target's config for the rest."""

    def __init__(
        self,
        base: QuantizationConfig | None,
        fp8_modules: frozenset[str],
        packed_modules_mapping: dict[str, list[str]],
        scale_layouts: dict[str, str] | None = None,
        vllm_names: dict[str, str] | None = None,
    ):
        super().__init__()
        self.base = base
        self.fp8_modules = fp8_modules
        self.scale_layouts = dict(scale_layouts or {})  # checkpoint module -> stored layout
        self.packed_modules_mapping = dict(packed_modules_mapping)
        # vLLM module name -> checkpoint name, for a drafter vLLM names otherwise (MiMo)
        self.vllm_names = vllm_names

    def _checkpoint_names(self, prefix: str) -> list[str]:
        """The checkpoint modules behind the vLLM module ``prefix``; a part that is none of the
        FP8 linears keeps its vLLM name, which :meth:`get_quant_method` finds unlisted."""
        if self.vllm_names is None:
            return checkpoint_names(prefix, self.packed_modules_mapping)
        head, _, last = prefix.rpartition(".")
        parts = [f"{head}.{part}" for part in self.packed_modules_mapping.get(last, [])] or [prefix]
        return [self.vllm_names.get(part, part) for part in parts]

    def get_name(self) -> Any:
        return NAME

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DrafterQuantConfig:
        raise NotImplementedError("built by the mtpconv plugin from mtpconv.json, never from a file")

    def get_quant_method(self, layer: Any, prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, LinearBase):
            names = self._checkpoint_names(prefix)
            listed = [n in self.fp8_modules for n in names]
            if names and all(listed):
                layouts = {self.scale_layouts.get(n) for n in names}
                if len(layouts) > 1:
                    raise ManifestError(
                        f"{prefix}: mtpconv.json stores the scales of {names} in different layouts "
                        f"{sorted(map(str, layouts))}; re-run `mtpconv quantize-mtp`."
                    )
                return Fp8DrafterLinearMethod(
                    per_channel=layouts == {"per_channel"}, column=layouts == {"per_channel_column"}
                )
            if any(listed):
                raise ManifestError(
                    f"{prefix}: mtpconv.json lists only some of {names} as FP8; "
                    "a fused module needs all its parts in one format."
                )
            if self.base is None:
                return UnquantizedLinearMethod()
        experts = _fp8_experts_method(self, layer, prefix)
        if experts is not None:
            return experts
        if self.base is None:
            return None
        return self.base.get_quant_method(layer, prefix)


def _fp8_experts_method(cfg: DrafterQuantConfig, layer: Any, prefix: str) -> QuantizeMethodBase | None:
    """The FP8 method for routed experts listed in the manifest, or None."""
    from mtpconv.vllm_plugin import moe

    if not moe.is_routed_experts(layer):
        return None
    names = checkpoint_names(prefix, {})
    if not names:
        return None
    base = names[0] + "."
    if not any(m.startswith(base) for m in cfg.fp8_modules):
        return None
    block = any(cfg.scale_layouts.get(m) == "block_128" for m in cfg.fp8_modules if m.startswith(base))
    return moe.fp8_experts_method(layer, prefix, block=block)


class DraftHeadQuantConfig(DrafterQuantConfig):
    """Gives the FP8 draft head :class:`Fp8DraftHeadMethod`; nothing else."""

    def __init__(self) -> None:
        super().__init__(None, frozenset(), {})

    def get_quant_method(self, layer: Any, prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, ParallelLMHead):
            return Fp8DraftHeadMethod()
        return None
