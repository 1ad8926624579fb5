"""The planted model (next token always t+1) served with MTP: exact output and
acceptance read from vLLM's own spec-decode counters (DESIGN §6, §7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.vllm_run import EXPECTED_CPU_FP8_KERNEL, PROMPTS, Run, planted_continuation, run
from tests.vllm.stage_local_probe import stage_local_probe

FP8 = "torch.float8_e4m3fn"


@pytest.fixture(scope="module")
def runs(models: dict[str, Path]) -> dict[str, Run]:
    return {
        "nospec": run(models["planted"], spec=False),
        "bf16": run(models["planted"]),
        "fp8": run(models["planted_fp8"]),
        "fp8_vocab": run(models["planted_fp8_vocab"], probe=stage_local_probe),
        "fp8_vocab_off": run(models["planted_fp8_vocab"], env={"MTPCONV_DRAFT_VOCAB": "0"}),
        "swapped_fp8": run(models["planted_swapped_fp8"]),
        # vLLM's local-argmax path calls the drafter's get_top_tokens, not compute_logits.
        "fp8_vocab_local_argmax": run(
            models["planted_fp8_vocab"], spec_extra={"use_local_argmax_reduction": True}
        ),
    }


def test_planted_target_generates_t_plus_one(runs: dict[str, Run]) -> None:
    assert runs["nospec"].outputs == [planted_continuation(p) for p in PROMPTS]


@pytest.mark.parametrize(
    "variant", ["bf16", "fp8", "fp8_vocab", "fp8_vocab_off", "swapped_fp8", "fp8_vocab_local_argmax"]
)
def test_speculative_output_equals_plain_greedy(runs: dict[str, Run], variant: str) -> None:
    assert runs[variant].outputs == runs["nospec"].outputs


@pytest.mark.parametrize("variant", ["bf16", "fp8", "fp8_vocab", "fp8_vocab_off", "fp8_vocab_local_argmax"])
def test_planted_drafter_is_accepted(runs: dict[str, Run], variant: str) -> None:
    r = runs[variant]
    assert r.drafted > 0
    assert r.acceptance >= 0.95, f"{variant}: {r.accepted}/{r.drafted}"


def test_fp8_drafter_within_two_points_of_bf16(runs: dict[str, Run]) -> None:
    bf16 = runs["bf16"].acceptance
    assert abs(runs["fp8"].acceptance - bf16) <= 0.02
    assert abs(runs["fp8_vocab"].acceptance - bf16) <= 0.02


def test_misconverted_drafter_loses_acceptance(runs: dict[str, Run]) -> None:
    r = runs["swapped_fp8"]
    assert r.drafted > 0
    assert r.acceptance <= 0.10, f"swapped fc halves still accepted {r.accepted}/{r.drafted}"


def test_source_without_manifest_builds_stock_layers(runs: dict[str, Run]) -> None:
    r = runs["bf16"]
    assert r.drafter_class == "mtpconv.vllm_plugin.qwen3_5.MtpconvQwen3_5MTP"
    assert r.modules["model.fc"][:2] == ("UnquantizedLinearMethod", "torch.bfloat16")
    assert not any("draft_lm_head" in name for name in r.modules)


def test_fp8_variant_really_runs_fp8_linears(runs: dict[str, Run]) -> None:
    mods = runs["fp8"].modules
    for name, shape in {
        "model.fc": (128, 256),
        "model.layers.0.self_attn.qkv_proj": (384, 128),
        "model.layers.0.self_attn.o_proj": (128, 128),
        "model.layers.0.mlp.gate_up_proj": (512, 128),
        "model.layers.0.mlp.down_proj": (128, 256),
    }.items():
        assert mods[name][:3] == ("Fp8DrafterLinearMethod", FP8, shape), name
        # vLLM's weight-only CPU kernel where its build has one (AVX-512), else our fallback
        assert mods[name][3] == EXPECTED_CPU_FP8_KERNEL, name
    assert not any("draft_lm_head" in name for name in mods)


def test_truncated_fp8_head_really_used(runs: dict[str, Run]) -> None:
    head = runs["fp8_vocab"].modules["model.draft_lm_head"]
    assert head[:3] == ("Fp8DraftHeadMethod", FP8, (384, 128))
    assert not any("draft_lm_head" in n for n in runs["fp8_vocab_off"].modules)
    assert runs["fp8_vocab_off"].modules["model.fc"][1] == FP8


def test_drafter_is_stage_local_under_pipeline_parallel(runs: dict[str, Run]) -> None:
    """Our forward embeds and returns hidden states on any PP rank; vLLM's own
    branching (Qwen3NextMTP: is_first_rank; Qwen3_5: is_last_rank) does not."""
    p = runs["fp8_vocab"].extra["probe"]
    for rank in ("middle", "last"):
        assert p[f"ours_{rank}"] == {
            "type": "Tensor",
            "shape": [3, 128],
            "embedded": 1,
            "equal_single_rank": True,
        }
    assert p["stock_qwen3_next_last"] == "AssertionError"  # asserts on intermediate tensors
    assert p["stock_qwen3_5_middle"] == "IntermediateTensors"  # hands off to a next stage
