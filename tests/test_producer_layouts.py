"""Exports in the layouts the producers write (issue 47), without vLLM.

llm-compressor's Qwen3.5 NVFP4 example copies ``mtp.*`` as stored (BF16, routed experts fused
3-D) and ignores ``re:^mtp.*``; a Qwen3.5 VLM has GDN layers (a 3-D ``conv1d``) and a vision
tower (a 5-D patch embedding, a position embedding) that vLLM builds without a quant method.
In every dialect: inspect reports no error on the source or the variant, the fused drafter
converts (FP8, one scale row per expert and output channel), every other tensor is
byte-identical. vLLM's own view of the compressed-tensors variant is
tests/quantconfig/test_vllm_ct_oracle.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.commands.inspect import inspect_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.findings import Severity
from mtpconv.layouts import linear_modules
from tests.helpers import raw_tensors

DIALECTS = {
    "compressed-tensors": Spec(
        family="qwen3_5_moe", quant="ct_nvfp4", fused_experts="drafter", vlm=True, gdn_and_vision=True
    ),
    "modelopt": Spec(
        family="qwen3_5_moe",
        quant="nvfp4",
        fused_experts="drafter",
        vlm=True,
        gdn_and_vision=True,
        exclude=["lm_head", "mtp*"],
    ),
    "bf16": Spec(family="qwen3_5_moe", fused_experts="drafter", vlm=True, gdn_and_vision=True),
}
NOT_LINEAR = (
    "model.language_model.layers.0.linear_attn.conv1d",
    "model.visual.patch_embed.proj",
    "model.visual.pos_embed",
)
FUSED = ("mtp.layers.0.mlp.experts.gate_up_proj", "mtp.layers.0.mlp.experts.down_proj")


def _errors(path: Path) -> list[str]:
    report = inspect_checkpoint(str(path))
    return [f.message for f in report.findings if f.severity is Severity.ERROR]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_fused_drafter_and_non_linear_modules_convert_cleanly(dialect: str, tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", DIALECTS[dialect])
    # The modules a rank rule would call linears are there, and none of them is an error.
    assert set(NOT_LINEAR) <= set(linear_modules(load_checkpoint_files(src).tensors))
    assert _errors(src) == []
    dst = tmp_path / "src-mtpfp8"
    report = quantize_mtp(str(src), dst, device="cpu")
    assert set(FUSED) <= {lin.module for lin in report.plan.linears}
    assert _errors(dst) == []
    before, after = raw_tensors(src), raw_tensors(dst)
    for name, (_dtype, shape, _) in before.items():
        if name.startswith("mtp.layers.0.mlp.experts."):
            assert after[name][:2] == ("F8_E4M3", shape), name
            scale = name + ("_scale" if dialect == "compressed-tensors" else "_scale_inv")
            assert after[scale][0] == "F32", scale
            if dialect == "compressed-tensors":
                assert after[scale][1] == [*shape[:2], 1], scale  # [E, out, 1]: per expert, per channel
        elif not name.startswith("mtp."):
            assert after[name] == before[name], f"{name} changed"
    assert all(n in after and after[n] == before[n] for n in before if n.startswith(NOT_LINEAR))
