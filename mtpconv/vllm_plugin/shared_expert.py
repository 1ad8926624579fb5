"""The drafter's SiLU-gated MLPs (an MoE drafter's shared expert) as one ``fp8_mlp`` call.

vLLM's ``Qwen2MoeMLP`` (``Qwen3NextMLP`` in ``qwen3_next.py`` and ``qwen3_5.py``) runs
``gate_up_proj``, ``SiluAndMul`` and ``down_proj`` as three calls; with our FP8 linears
on CUDA that is two ``torch.ops.mtpconv.fp8_linear`` calls with vLLM's activation
kernel between them. :func:`fuse_gated_mlps` gives each such module of a loaded
drafter a forward that makes one ``torch.ops.mtpconv.fp8_mlp`` call instead
(:func:`mtpconv.kernels.fp8_mlp`: one launch at 1-4 tokens on Hopper, three launches
elsewhere), then applies ``expert_gate`` as vLLM's forward does.

Only modules that compute the same function that way are switched: vLLM's own
``Qwen2MoeMLP.forward`` (not a subclass that overrides it), both linears FP8 through
:class:`~mtpconv.vllm_plugin.quant.Fp8DrafterLinearMethod` on the ``cuda`` kernel,
no bias, vLLM's ``SiluAndMul``, and a ``down_proj`` that does not all-reduce its own
output (the Qwen3-Next / Qwen3.5-MoE shared expert leaves that to the routed experts; a
tensor-parallel dense MLP does it inside ``down_proj``, which one opaque op would skip).
A dense Qwen3.5 drafter's MLP is the same class, so at tensor-parallel size 1 it is
switched too. The forward is set on the instance; the class, and every other module,
keep vLLM's. ``MTPCONV_FUSED_MLP=0`` (the switch that also keeps ``fp8_mlp`` at three
launches) leaves every module on vLLM's forward.
"""

from __future__ import annotations

import os
import types
from typing import Any

import torch
import torch.nn.functional as F

from mtpconv.kernels import mlp as kernels_mlp
from mtpconv.vllm_plugin import kernels
from mtpconv.vllm_plugin.kernels import PreparedFp8
from mtpconv.vllm_plugin.quant import Fp8DrafterLinearMethod


def enabled() -> bool:
    """Whether the plugin may switch MLPs to ``fp8_mlp`` (not under ``MTPCONV_FUSED_MLP=0``)."""
    return os.environ.get(kernels_mlp.ENV, "").strip() != "0"


def _gated_mlp_class() -> type[torch.nn.Module]:
    from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP

    return Qwen2MoeMLP


def _on_cuda_kernel(linear: Any) -> bool:
    """An FP8 drafter linear, prepared for the ``cuda`` kernel, without a bias."""
    prepared = getattr(linear, "mtpconv_fp8", None)
    return (
        isinstance(getattr(linear, "quant_method", None), Fp8DrafterLinearMethod)
        and isinstance(prepared, PreparedFp8)
        and prepared.kernel == kernels.CUDA
        and getattr(linear, "bias", None) is None
    )


def _reduces_itself(down_proj: Any) -> bool:
    """Whether ``down_proj`` all-reduces its output across tensor-parallel ranks."""
    return bool(getattr(down_proj, "reduce_results", False)) and int(getattr(down_proj, "tp_size", 1)) > 1


def fusable(module: torch.nn.Module) -> bool:
    """Whether ``module``'s forward can be one ``fp8_mlp`` call with the same result."""
    from vllm.model_executor.layers.activation import SiluAndMul

    if not all(hasattr(module, a) for a in ("gate_up_proj", "down_proj", "act_fn")):
        return False
    cls = _gated_mlp_class()
    # The replacement reproduces this forward; a subclass that overrides it keeps its own.
    if not isinstance(module, cls) or type(module).forward is not cls.forward:
        return False
    gate_up, down = module.gate_up_proj, module.down_proj
    return (
        _on_cuda_kernel(gate_up)
        and _on_cuda_kernel(down)
        and isinstance(module.act_fn, SiluAndMul)
        and not _reduces_itself(down)
    )


def _scale(prepared: PreparedFp8) -> torch.Tensor:
    """The 0-d scale when every row shares one (``fp8_mlp``'s per-tensor path), else per row;
    the same choice :meth:`PreparedFp8.apply` makes for ``fp8_linear``."""
    return prepared.scalar_scale if prepared.uniform else prepared.row_scale


def fp8_mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """``Qwen2MoeMLP.forward`` with gate_up, SiLU * up and down as one ``fp8_mlp`` call."""
    gate_up: PreparedFp8 = self.gate_up_proj.mtpconv_fp8
    down: PreparedFp8 = self.down_proj.mtpconv_fp8
    out: torch.Tensor = torch.ops.mtpconv.fp8_mlp(
        x, gate_up.weight, _scale(gate_up), down.weight, _scale(down)
    )
    if self.expert_gate is not None:
        out = F.sigmoid(self.expert_gate(x)[0]) * out
    return out


def fuse_gated_mlps(root: torch.nn.Module) -> tuple[int, int]:
    """Give every :func:`fusable` module under ``root`` :func:`fp8_mlp_forward`.

    Returns (switched, gated MLPs under ``root``). Call it once the quant methods'
    ``process_weights_after_loading`` has run (it reads each linear's ``mtpconv_fp8``);
    calling it again binds the same forward again. Nothing is switched under
    ``MTPCONV_FUSED_MLP=0``.
    """
    cls = _gated_mlp_class()
    gated = [m for m in root.modules() if isinstance(m, cls)]
    if not enabled():
        return 0, len(gated)
    import mtpconv.kernels.op  # noqa: F401  (defines torch.ops.mtpconv.fp8_mlp)

    switched = 0
    for module in gated:
        if fusable(module):
            # On the instance: the class, which the target model uses too, keeps vLLM's forward.
            setattr(module, "forward", types.MethodType(fp8_mlp_forward, module))  # noqa: B010
            switched += 1
    return switched, len(gated)


def summary(switched: int, gated: int) -> str:
    """One log line: what :func:`fuse_gated_mlps` did with the drafter's ``Qwen2MoeMLP`` modules
    (an MoE drafter's shared expert, a dense drafter's MLP)."""
    what = f"the drafter's {gated} SiLU-gated MLP(s) (shared expert or dense MLP)"
    if not enabled():
        return f"{kernels_mlp.ENV}=0: {what} keep vLLM's forward"
    line = f"{switched} of {what} run as one torch.ops.mtpconv.fp8_mlp call"
    if switched < gated:
        line += (
            "; the others keep vLLM's forward (switching needs both linears FP8 on the cuda kernel, "
            "no bias, and a down_proj that does not all-reduce)"
        )
    return line
