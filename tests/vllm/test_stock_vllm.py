"""Stock vLLM without the plugin must refuse the variant loudly (DESIGN §5)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import sys
    from vllm import LLM
    llm = LLM(model=sys.argv[1], dtype="bfloat16", enforce_eager=True,
              distributed_executor_backend="uni", max_model_len=256, seed=0,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    print("LOADED")
""")


@pytest.mark.parametrize(
    ("variant", "refused"), [("planted_fp8", "weight_scale"), ("planted_fp8_vocab", "draft_lm_head")]
)
def test_stock_vllm_refuses_the_variant(models: dict[str, Path], variant: str, refused: str) -> None:
    # VLLM_PLUGINS names no plugin: vLLM loads none, ours included (a fresh
    # process, so nothing this test session registered leaks in).
    env = dict(os.environ, VLLM_PLUGINS="none")
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(models[variant])],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "LOADED" not in proc.stdout
    assert "mtpconv/vllm_plugin" not in proc.stderr  # vLLM's own drafter class failed
    error = [ln for ln in proc.stderr.splitlines() if "There is no module or parameter named" in ln]
    assert error and refused in error[-1], proc.stderr[-2000:]
