"""MiMo's drafter (``MiMoMTP``): FP8 linears and the truncated draft head.

vLLM builds MiMo's MTP block with the module prefix ``model.layers.{N + i}`` while the
checkpoint stores it as ``model.mtp_layers.{i}`` (``N`` target layers); the one
translation, :func:`~mtpconv.families.vllm_drafter_key`, tells the FP8 config
which vLLM modules are the manifest's FP8 linears. ``input_proj`` is a plain ``nn.Linear``
in vLLM and stays BF16. vLLM's forward is kept: it never branches on the pipeline stage.
"""

from __future__ import annotations

from vllm.config import VllmConfig
from vllm.model_executor.models.mimo_mtp import MiMoMTP

from mtpconv.families import vllm_drafter_key
from mtpconv.vllm_plugin.drafter import MtpconvDrafterMixin
from mtpconv.vllm_plugin.settings import DrafterSettings


class MtpconvMiMoMTP(MtpconvDrafterMixin, MiMoMTP):
    """vLLM's ``MiMoMTP`` serving ``-mtpfp8`` variants."""

    # Qwen2's decoder layer, which MiMo's MTP block is: its fused modules and their parts.
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    @classmethod
    def vllm_module_names(cls, settings: DrafterSettings, vllm_config: VllmConfig) -> dict[str, str] | None:
        layers = int(vllm_config.model_config.hf_config.num_hidden_layers)
        return {vllm_drafter_key(name, "mimo", layers): name for name in settings.fp8_modules}
