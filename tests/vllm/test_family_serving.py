"""A non-Qwen MTP family served end to end by vLLM (issue 14): MiMo (``MiMoMTP``).

The planted MiMo model (``fixtures.planted_mimo``: next token ``t + 1``, a drafter
that passes its input token's embedding through) and its ``quantize-mtp`` standard variant
are served with ``method="mtp"``, ``num_speculative_tokens=2``: greedy output must equal
the no-speculation output. Stock vLLM (``VLLM_PLUGINS=none``, a fresh process) must load
the drafter's quantizable linears on its own ModelOpt FP8 method and keep the plain
``nn.Linear`` ``input_proj`` BF16; with the plugin loaded its ``MiMoMTP`` class builds the
same linears on its own FP8 method, and a variant with a draft vocabulary gets the truncated
head (stock vLLM ignores it). Acceptance is read from vLLM's spec-decode counters.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from fixtures.vllm_run import (
    PROMPTS,
    Run,
    describe_plain_and_target,
    planted_continuation,
    run,
    run_script_without_plugin,
)

FP8 = "torch.float8_e4m3fn"
BF16 = "torch.bfloat16"
MIMO_MTP = "vllm.model_executor.models.mimo_mtp.MiMoMTP"
PLUGIN_MIMO_MTP = "mtpconv.vllm_plugin.mimo.MtpconvMiMoMTP"
# The tiny MiMo's config is remote code (configuration_mimo.py), as Xiaomi's checkpoints are.
REMOTE = {"trust_remote_code": True}
# vLLM's MiMoMTP builds its MTP block under ``model.mtp_layers.{N}.mtp_block`` (N = num_hidden_layers).
DRAFTER_LINEARS = {
    f"model.mtp_layers.1.mtp_block.{m}"
    for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
}

_STOCK = textwrap.dedent("""
    import json, sys
    if __name__ == "__main__":
        from fixtures.vllm_stub import use_in_this_environment
        use_in_this_environment()
        from pathlib import Path
        import mtpconv.vllm_plugin as plugin
        from fixtures.vllm_run import describe_plain_and_target, run
        r = run(Path(sys.argv[1]), llm_kwargs={"trust_remote_code": True}, probe=describe_plain_and_target)
        print("RESULT " + json.dumps({"outputs": r.outputs, "drafted": r.drafted,
              "accepted": r.accepted, "cls": r.drafter_class, "plugin": plugin._registered,
              "modules": {k: [v[0], v[1]] for k, v in r.modules.items()}, "probe": r.extra["probe"]}))
""")


def _stock(model: Path) -> dict[str, Any]:
    """Serve ``model`` with MTP in a fresh process whose vLLM loads no plugin."""
    proc, result = run_script_without_plugin(_STOCK, model)
    assert proc.returncode == 0 and result is not None, proc.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def runs(models: dict[str, Path]) -> dict[str, Run]:
    import mtpconv.vllm_plugin as plugin

    out = {
        "nospec": run(models["mimo"], spec=False, llm_kwargs=REMOTE),
        "bf16": run(models["mimo"], llm_kwargs=REMOTE, probe=describe_plain_and_target),
        "fp8": run(models["mimo_fp8"], llm_kwargs=REMOTE, probe=describe_plain_and_target),
        "swapped_fp8": run(models["mimo_swapped_fp8"], llm_kwargs=REMOTE),
        "fp8_vocab": run(models["mimo_fp8_vocab"], llm_kwargs=REMOTE, probe=describe_plain_and_target),
    }
    # vLLM loaded the plugin in this process (its entry point, VLLM_PLUGINS unset).
    assert plugin._registered, "the mtpconv plugin was not loaded by vLLM in this process"
    return out


@pytest.fixture(scope="module")
def stock(models: dict[str, Path]) -> dict[str, Any]:
    return _stock(models["mimo_fp8"])


def _report(name: str, drafted: int, accepted: int) -> None:
    print(f"\nmimo {name}: {accepted}/{drafted} drafts accepted ({accepted / max(drafted, 1):.1%})")


def test_mimo_target_generates_t_plus_one(runs: dict[str, Run]) -> None:
    assert runs["nospec"].outputs == [planted_continuation(p) for p in PROMPTS]


def test_bf16_source_with_mtp_equals_no_spec(runs: dict[str, Run]) -> None:
    r = runs["bf16"]
    _report("BF16 source", r.drafted, r.accepted)
    # The plugin's class, behaving exactly as vLLM's on a checkpoint without mtpconv.json.
    assert r.drafter_class == PLUGIN_MIMO_MTP
    assert r.outputs == runs["nospec"].outputs
    # The one MTP layer drafts both tokens; MiMoMTP zeroes the embedding at position 0, so a
    # one-token prompt's first drafts are lost: not every draft, but nearly all, is accepted.
    assert r.drafted > 0 and r.acceptance >= 0.9, f"{r.accepted}/{r.drafted}"
    assert set(r.modules) >= DRAFTER_LINEARS
    assert all(r.modules[m][:2] == ("UnquantizedLinearMethod", BF16) for m in DRAFTER_LINEARS)


def test_stock_vllm_serves_the_mimo_variant_with_its_own_fp8(
    runs: dict[str, Run], stock: dict[str, Any]
) -> None:
    _report("FP8 variant, stock vLLM", stock["drafted"], stock["accepted"])
    assert stock["plugin"] is False  # VLLM_PLUGINS=none: vLLM loaded no plugin
    assert stock["cls"] == MIMO_MTP
    assert stock["outputs"] == runs["nospec"].outputs
    assert stock["drafted"] > 0 and stock["accepted"] / stock["drafted"] >= 0.9, stock
    linears = {k: v for k, v in stock["modules"].items() if k.startswith("model.mtp_layers.")}
    assert set(linears) == DRAFTER_LINEARS
    # vLLM's own ModelOpt FP8 method (FP8_PER_CHANNEL_PER_TOKEN), FP8 weights in memory.
    assert all(v == ["ModelOptLinearMethod", FP8] for v in linears.values()), linears
    # input_proj is a plain nn.Linear in vLLM's MiMoMTP: no quant config reaches it, it stays BF16.
    assert stock["probe"]["plain"] == {"model.mtp_layers.1.input_proj": ["Linear", BF16]}
    # The target is untouched: every target linear unquantized BF16, as in the source.
    target = stock["probe"]["target"]
    assert target and all(v[1] == BF16 and v[0].startswith("Unquantized") for v in target.values()), target


def test_plugin_on_serves_the_mimo_variant(runs: dict[str, Run], stock: dict[str, Any]) -> None:
    r = runs["fp8"]
    _report("FP8 variant, plugin on", r.drafted, r.accepted)
    assert r.drafter_class == PLUGIN_MIMO_MTP
    assert r.outputs == runs["nospec"].outputs
    assert r.drafted > 0 and r.acceptance >= 0.9, f"{r.accepted}/{r.drafted}"
    assert abs(r.acceptance - runs["bf16"].acceptance) <= 0.02
    assert (r.drafted, r.accepted) == (stock["drafted"], stock["accepted"])
    # The plugin's own FP8 method on vLLM's module names (model.layers.{N} in the quant config).
    assert {k: list(v[:2]) for k, v in r.modules.items() if k in DRAFTER_LINEARS} == {
        m: ["Fp8DrafterLinearMethod", FP8] for m in DRAFTER_LINEARS
    }
    assert r.extra["probe"]["plain"] == {"model.mtp_layers.1.input_proj": ["Linear", BF16]}
    assert not any("draft_lm_head" in k for k in r.modules)  # no draft vocabulary here


def test_plugin_serves_the_mimo_truncated_head(runs: dict[str, Run]) -> None:
    r = runs["fp8_vocab"]
    _report("FP8 variant + 384-row FP8 draft head, plugin on", r.drafted, r.accepted)
    assert r.drafter_class == PLUGIN_MIMO_MTP
    assert r.outputs == runs["nospec"].outputs
    # The planted continuations of PROMPTS stay inside ids 0..383 (the head's rows).
    assert r.drafted > 0 and abs(r.acceptance - runs["fp8"].acceptance) <= 0.02, f"{r.accepted}/{r.drafted}"
    head = r.modules["model.draft_lm_head"]
    assert head[:3] == ("Fp8DraftHeadMethod", FP8, (384, 128))
    target = r.extra["probe"]["target"]
    assert target and all(v[1] == BF16 for v in target.values()), target


def test_misconverted_mimo_drafter_loses_acceptance(runs: dict[str, Run]) -> None:
    # input_proj halves swapped: the drafter reads the target's hidden state and proposes the
    # token just sampled. Output stays exact (the target verifies); acceptance collapses.
    r = runs["swapped_fp8"]
    _report("FP8 variant with swapped input_proj", r.drafted, r.accepted)
    assert r.outputs == runs["nospec"].outputs
    assert r.drafted > 0 and r.acceptance <= 0.10, f"{r.accepted}/{r.drafted}"
