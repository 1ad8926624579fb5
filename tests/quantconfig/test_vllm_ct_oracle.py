"""A compressed-tensors variant read by vLLM's own CompressedTensorsConfig (needs vLLM).

The checks are `fixtures.ct_oracle` (shared with scripts/llmcompressor_exports.py, which
runs them on exports llm-compressor itself made). Routed FP8 experts need AMX or a GPU to run
here, so for per-expert ones the config-level check is the proof; fused 3-D FP8 experts (issue
47) are also loaded through vLLM's own routed-experts loader, byte for byte.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from fixtures.ct_oracle import ask_vllm, oracle_case, problems
from mtpconv.commands.quantize_mtp import quantize_mtp


def _case(root: Path, name: str, spec: Spec) -> dict[str, Any]:
    src = write_checkpoint(root / f"{name}-src", spec)
    out = root / f"{name}-out"
    report = quantize_mtp(str(src), out, device="cpu", fp8_from_4bit=True)
    return oracle_case(src, out, {lin.module for lin in report.plan.linears})


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_reads_the_ct_variant_drafter_as_fp8_and_the_target_as_before(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    cases = [
        _case(
            tmp_path, "nvfp4-drafter", Spec(family="qwen3_5_moe", quant="ct_nvfp4", drafter_quant="ct_nvfp4")
        ),
        _case(tmp_path, "bf16-drafter", Spec(family="qwen3_5_moe", quant="ct_nvfp4", shards=2)),
        # llm-compressor's Qwen3.5 NVFP4 example (issue 47): mtp.* copied as stored, fused 3-D
        # experts, re:^mtp.* ignored; a VLM with GDN layers and its vision tower quantized
        _case(
            tmp_path,
            "fused-drafter",
            Spec(
                family="qwen3_5_moe", quant="ct_nvfp4", fused_experts="drafter", vlm=True, gdn_and_vision=True
            ),
        ),
    ]
    answers = ask_vllm(cases)
    for case, res in zip(cases, answers, strict=True):
        assert problems(case, res) == []
        assert any(s is not None for pair in res["target"].values() for s in pair[0])  # NVFP4 target layers
        assert "mtp.fc" in res["drafter"] and "mtp.layers.0.mlp.experts" in res["drafter"]
        assert "mtp.layers.0.self_attn.qkv_proj" in res["drafter"]
        assert res["run"] and (res["experts"] or "fused" not in case["files"][0])
    assert cases[2]["fused_experts"] == ["mtp.layers.0.mlp.experts"]
    assert answers[2]["experts"]["mtp.layers.0.mlp.experts"]["same"] == dict.fromkeys(
        ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"), True
    )
