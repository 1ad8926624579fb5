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
from mtpconv.vllm_plugin.drafter import MtpconvDrafterMixin, logger
from mtpconv.vllm_plugin.settings import DrafterSettings

# Measured on the H100 (README, "GPU end to end"): said for each drafter built on CUDA until the
# full-depth rows are measured again.
GPU_WARNING = (
    "mtpconv: on an H100 under vLLM 0.26's Model Runner V2 an earlier mtpconv's FP8 MiMo drafter "
    "accepted 1-43% of drafts the BF16 drafter accepted all of (36 target layers; output "
    "unchanged, decoding slower). This version accepted every draft at 4 target layers; 36 were "
    "not measured again. Measure this variant with `mtpconv eval` before serving it on a GPU."
)


class MtpconvMiMoMTP(MtpconvDrafterMixin, MiMoMTP):
    """vLLM's ``MiMoMTP`` serving ``-mtpfp8`` variants."""

    # Qwen2's decoder layer, which MiMo's MTP block is: its fused modules and their parts.
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if self.mtpconv is not None and str(vllm_config.device_config.device_type) == "cuda":
            logger.warning("%s", GPU_WARNING)

    @classmethod
    def vllm_module_names(cls, settings: DrafterSettings, vllm_config: VllmConfig) -> dict[str, str] | None:
        layers = int(vllm_config.model_config.hf_config.num_hidden_layers)
        return {vllm_drafter_key(name, "mimo", layers): name for name in settings.fp8_modules}
