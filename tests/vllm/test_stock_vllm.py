"""Stock vLLM (plugin off) serves the standard variant correctly, or refuses it loudly.

Each run is a fresh process with ``VLLM_PLUGINS=none``: vLLM loads no plugin, ours
included, so nothing this test session registered leaks in (DESIGN §5).
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fixtures.vllm_run import PROMPTS, planted_continuation, run_script_without_plugin

FP8 = "torch.float8_e4m3fn"

_SCRIPT = textwrap.dedent("""
    import json, sys
    if __name__ == "__main__":
        from fixtures.vllm_stub import use_in_this_environment
        use_in_this_environment()
        from pathlib import Path
        from fixtures.vllm_run import run
        r = run(Path(sys.argv[1]))
        print("RESULT " + json.dumps({"outputs": r.outputs, "drafted": r.drafted,
              "accepted": r.accepted, "cls": r.drafter_class,
              "modules": {k: [v[0], v[1]] for k, v in r.modules.items()}}))
""")


def _has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _stock(model: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    return run_script_without_plugin(_SCRIPT, model)


@pytest.fixture(scope="module")
def stock_dense(models: dict[str, Path]) -> dict[str, dict[str, Any]]:
    out = {}
    for name in ("planted_fp8", "planted_fp8_vocab"):
        proc, result = _stock(models[name])
        assert proc.returncode == 0 and result is not None, proc.stderr[-3000:]
        out[name] = result
    return out


@pytest.mark.parametrize("variant", ["planted_fp8", "planted_fp8_vocab"])
def test_stock_vllm_serves_the_dense_variant(stock_dense: dict[str, dict[str, Any]], variant: str) -> None:
    r = stock_dense[variant]
    assert r["cls"].startswith("vllm.model_executor.models.qwen3_5_mtp.")  # vLLM's own class
    # Greedy output with MTP equals the no-spec output (the planted continuation).
    assert r["outputs"] == [planted_continuation(p) for p in PROMPTS]
    assert r["drafted"] > 0 and r["accepted"] / r["drafted"] >= 0.9, r
    linears = {k: v for k, v in r["modules"].items() if k.startswith("model.") and "embed" not in k}
    assert set(linears) == {
        "model.fc",
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_up_proj",
        "model.layers.0.mlp.down_proj",
    }
    # vLLM's own ModelOpt FP8 method (FP8_PER_CHANNEL_PER_TOKEN), FP8 weights in memory.
    assert all(v == ["ModelOptLinearMethod", FP8] for v in linears.values()), linears
    # Stock vLLM never sees the truncated head: the full target head is shared.
    assert not any("draft_lm_head" in k for k in r["modules"])


def test_truncated_head_is_invisible_to_stock_vllm(stock_dense: dict[str, dict[str, Any]]) -> None:
    assert stock_dense["planted_fp8_vocab"]["outputs"] == stock_dense["planted_fp8"]["outputs"]
    assert stock_dense["planted_fp8_vocab"]["accepted"] == stock_dense["planted_fp8"]["accepted"]


def test_stock_vllm_on_the_qwen3_next_variant_serves_or_refuses_loudly(models: dict[str, Path]) -> None:
    # Its routed experts are declared FP8_PB_WO: vLLM-CPU runs FP8 MoE only with AMX
    # (and refines 128x128 blocks for this tiny 64-wide expert), so here the proof that
    # stock vLLM reads them right is the config level (tests/quantconfig/test_vllm_standard.py).
    proc, result = _stock(models["next_fp8_vocab"])
    if result is not None:
        assert result["outputs"] == [planted_continuation(p) for p in PROMPTS]
        assert result["accepted"] / result["drafted"] >= 0.9
        return
    assert not _has_amx() or proc.returncode != 0
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr or "Error" in proc.stderr, proc.stderr[-2000:]
    assert "mtpconv/vllm_plugin" not in proc.stderr
