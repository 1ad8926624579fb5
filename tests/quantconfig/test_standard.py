"""The standard declaration: which style each source gets, and the nn.Linear exception."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.formats.fp8 import dequantize_fp8, quantize_fp8
from mtpconv.formats.fp8_table import replicate_scale
from mtpconv.formats.scale_layout import ScaleLayout
from mtpconv.manifest import read_manifest


def test_replicated_scales_dequantize_to_the_per_tensor_weights() -> None:
    w = torch.randn(200, 300)
    fp8 = quantize_fp8(w)
    ref = dequantize_fp8(fp8.weight, fp8.scale)
    channel = torch.from_numpy(replicate_scale(fp8.scale.numpy(), ScaleLayout.PER_CHANNEL, (200, 300)))
    assert channel.shape == (200,)
    assert torch.equal(fp8.weight.float() * channel[:, None], ref)
    block = torch.from_numpy(replicate_scale(fp8.scale.numpy(), ScaleLayout.BLOCK_128, (200, 300)))
    assert block.shape == (2, 3) and bool((block == fp8.scale).all())
    per_expert = torch.tensor([1.0, 2.0]).numpy()
    experts = torch.from_numpy(
        replicate_scale(per_expert, ScaleLayout.BLOCK_128, (2, 256, 64), fused_halves=True)
    )
    assert experts.shape == (2, 2, 1) and experts[1].eq(2.0).all()


def test_mla_target_with_fp8_kv_keeps_the_exclusion_style(tmp_path: Path) -> None:
    spec = Spec(family="deepseek_v3", quant="nvfp4", extra_config={"kv_lora_rank": 16})
    src = write_checkpoint(tmp_path / "src", spec)
    report = quantize_mtp(str(src), tmp_path / "dst", device="cpu")
    assert report.declaration is not None and report.declaration.style.value == "exclusion"
    assert "MLAAttention" in report.declaration.reason
    qc = json.loads((tmp_path / "dst" / "config.json").read_text())["quantization_config"]
    assert qc["quant_algo"] == "NVFP4"  # the source's own declaration, drafter excluded
    manifest = read_manifest(tmp_path / "dst")
    assert manifest is not None and manifest.drafter.declaration == "exclusion"


def test_deepseek_v4_mla_without_kv_lora_rank_keeps_the_exclusion_style_too() -> None:
    """DeepSeek-V4's config has no kv_lora_rank: vLLM calls it MLA by compress_ratios +
    head_dim (is_deepseek_mla), and so does the KV-cache trap check."""
    from mtpconv.layouts import MtpLayout
    from mtpconv.quantconfig.documents import QuantConfigs
    from mtpconv.quantconfig.standard import declare_drafter, is_mla

    assert not is_mla({"compress_ratios": [1, 4]}) and not is_mla({"model_type": "deepseek_v3"})
    hf_quant = {
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "exclude_modules": []},
    }
    v4 = {"model_type": "deepseek_v4", "num_hidden_layers": 2, "compress_ratios": [1, 4], "head_dim": 64}
    configs = QuantConfigs(v4, hf_quant)
    layout = MtpLayout(
        family="deepseek_v4",
        model_type="deepseek_v4",
        drafter_prefixes=("mtp.",),
        drafter_tensors=[],
        linears=[],
        declared_layers=1,
        found_layers=1,
        embedding=None,
        lm_head=None,
        tie_word_embeddings=False,
        hidden_size=None,
        vocab_size=None,
    )
    _, declaration = declare_drafter(configs, {}, layout, fp8_linears=[])
    assert declaration.style.value == "exclusion" and "MLAAttention" in declaration.reason


def test_plain_nn_linear_drafter_modules_stay_bf16(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="deepseek_v3"))
    report = quantize_mtp(str(src), tmp_path / "dst", device="cpu")
    kept = report.plan.layout.kept_bf16
    assert kept and all(m.endswith(".eh_proj") for m in kept)
    assert not any(lin.module.endswith(".eh_proj") for lin in report.plan.linears)
    manifest = read_manifest(tmp_path / "dst")
    assert manifest is not None and set(manifest.drafter.kept_bf16) == set(kept)
    assert report.declaration is not None and report.declaration.style.value == "standard"
    layers = json.loads((tmp_path / "dst" / "config.json").read_text())["quantization_config"][
        "quantized_layers"
    ]
    assert not any(k.endswith("eh_proj") for k in layers)
