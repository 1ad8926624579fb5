"""Greedy output with MTP equals plain greedy decoding, on a model whose random
drafter is mostly rejected (vLLM's correction path), on a tiny Qwen3.5-MoE model
and on a tiny Qwen3-Next model (``Qwen3NextMTP``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.vllm_run import PROMPTS, Run, planted_continuation, run

FP8 = "torch.float8_e4m3fn"


@pytest.fixture(scope="module")
def random_runs(models: dict[str, Path]) -> dict[str, Run]:
    return {
        name: run(models[src], spec=name != "nospec")
        for name, src in {
            "nospec": "random",
            "bf16": "random",
            "fp8": "random_fp8",
            "fp8_vocab": "random_fp8_vocab",
            "fp8_vocab_bf16": "random_fp8_vocab_bf16",
        }.items()
    }


@pytest.fixture(scope="module")
def moe_runs(models: dict[str, Path]) -> dict[str, Run]:
    return {
        name: run(models[src], spec=name != "nospec")
        for name, src in {
            "nospec": "moe",
            "bf16": "moe",
            "fp8": "moe_fp8",
            "fp8_vocab": "moe_fp8_vocab",
        }.items()
    }


@pytest.fixture(scope="module")
def next_runs(models: dict[str, Path]) -> dict[str, Run]:
    return {
        name: run(models[src], spec=name != "nospec")
        for name, src in {"nospec": "next", "bf16": "next", "fp8_vocab": "next_fp8_vocab"}.items()
    }


@pytest.mark.parametrize("variant", ["bf16", "fp8", "fp8_vocab", "fp8_vocab_bf16"])
def test_random_drafter_output_unchanged(random_runs: dict[str, Run], variant: str) -> None:
    r = random_runs[variant]
    assert r.outputs == random_runs["nospec"].outputs
    assert r.drafted > 0
    # The drafter is random: most proposals are rejected and vLLM corrects them.
    assert r.accepted < r.drafted


def test_random_outputs_are_not_trivial(random_runs: dict[str, Run]) -> None:
    outs = random_runs["nospec"].outputs
    assert len({tuple(o) for o in outs}) == len(PROMPTS)
    assert all(o != planted_continuation(p) for o, p in zip(outs, PROMPTS, strict=True))


def test_bf16_draft_head(random_runs: dict[str, Run]) -> None:
    head = random_runs["fp8_vocab_bf16"].modules["model.draft_lm_head"]
    assert head[:3] == ("UnquantizedEmbeddingMethod", "torch.bfloat16", (384, 128))
    assert random_runs["fp8_vocab_bf16"].modules["model.fc"][1] == FP8


@pytest.mark.parametrize("variant", ["bf16", "fp8", "fp8_vocab"])
def test_moe_output_unchanged_and_accepted(moe_runs: dict[str, Run], variant: str) -> None:
    assert moe_runs["nospec"].outputs == [planted_continuation(p) for p in PROMPTS]
    r = moe_runs[variant]
    assert r.outputs == moe_runs["nospec"].outputs
    assert r.acceptance >= 0.95, f"{variant}: {r.accepted}/{r.drafted}"


def test_moe_fp8_experts_really_used(moe_runs: dict[str, Run]) -> None:
    r = moe_runs["fp8_vocab"]
    assert r.drafter_class == "mtpconv.vllm_plugin.qwen3_5.MtpconvQwen3_5MoeMTP"
    # vLLM 0.32 keeps them in mlp.experts.routed_experts; find them by parameter name.
    w13 = next(n for n in r.modules if n.endswith(".w13_weight"))
    experts = w13.removesuffix(".w13_weight")
    assert r.modules[w13][:3] == ("Fp8ExpertsLoopMethod", FP8, (4, 128, 128))
    assert r.modules[f"{experts}.w2_weight"][:3] == ("Fp8ExpertsLoopMethod", FP8, (4, 128, 64))
    assert r.modules["model.layers.0.mlp.shared_expert.gate_up_proj"][1] == FP8
    assert r.modules["model.layers.0.self_attn.qkv_proj"][1] == FP8
    assert r.modules["model.draft_lm_head"][:3] == ("Fp8DraftHeadMethod", FP8, (384, 128))
    stock = moe_runs["bf16"].modules[f"{experts}.w13_weight"]
    assert stock[:2] == ("UnquantizedFusedMoEMethod", "torch.bfloat16")


@pytest.mark.parametrize("variant", ["bf16", "fp8_vocab"])
def test_qwen3_next_output_unchanged_and_accepted(next_runs: dict[str, Run], variant: str) -> None:
    assert next_runs["nospec"].outputs == [planted_continuation(p) for p in PROMPTS]
    r = next_runs[variant]
    assert r.drafter_class == "mtpconv.vllm_plugin.qwen3_next.MtpconvQwen3NextMTP"
    assert r.outputs == next_runs["nospec"].outputs
    assert r.acceptance >= 0.95, f"{variant}: {r.accepted}/{r.drafted}"


def test_qwen3_next_fp8_drafter_really_used(next_runs: dict[str, Run]) -> None:
    mods = next_runs["fp8_vocab"].modules
    assert mods["model.fc"][:2] == ("Fp8DrafterLinearMethod", FP8)
    assert mods["model.layers.0.self_attn.qkv_proj"][:2] == ("Fp8DrafterLinearMethod", FP8)
    assert mods["model.draft_lm_head"][:3] == ("Fp8DraftHeadMethod", FP8, (384, 128))
    assert next(v for n, v in mods.items() if n.endswith(".w13_weight"))[1] == FP8
    assert next_runs["bf16"].modules["model.fc"][:2] == ("UnquantizedLinearMethod", "torch.bfloat16")
