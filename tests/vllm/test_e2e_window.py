"""Windowed draft attention in real vLLM (CPU): prompts longer than the window (issue 16).

The window is recorded by ``quantize-mtp --draft-window`` and applied by the plugin
to the drafter's ``Attention`` layers only: greedy output with MTP equals the
non-speculative run, the drafter's layers carry the window and the target's do not,
and on a drafter whose attention matters the window reaches vLLM-CPU's attention
kernel (it changes acceptance).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fixtures.vllm_run import EXPECTED_CPU_FP8_KERNEL, Run, planted_continuation, quantize_mtp, run

WINDOW = 16
PROMPT_LEN = 48  # three times the window
MAX_TOKENS = 32
# Continuations (+ 2 drafts) stay inside the 384-id draft head of the *_vocab variant.
PROMPTS = [[(start + i) % 512 for i in range(PROMPT_LEN)] for start in (3, 100, 250)]


def attention_windows(worker: Any) -> dict[str, dict[str, int | None]]:
    """``sliding_window`` of every vLLM ``Attention`` module, drafter and target."""
    from vllm.model_executor.layers.attention import Attention

    runner = worker.model_runner
    return {
        role: {n: m.sliding_window for n, m in model.named_modules() if isinstance(m, Attention)}
        for role, model in (("drafter", runner.drafter.model), ("target", runner.model))
    }


@pytest.fixture(scope="module")
def runs(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("window")
    ids = str(models["planted_fp8_vocab"].parent / "ids.pt")
    window = ["--draft-window", str(WINDOW)]
    fp8_window = quantize_mtp(models["planted"], root / "fp8_window", *window)
    vocab_window = quantize_mtp(models["planted"], root / "fp8_vocab_window", "--draft-vocab", ids, *window)
    kw: dict[str, Any] = {"prompts": PROMPTS, "max_tokens": MAX_TOKENS}
    return {
        "nospec": run(models["planted"], spec=False, **kw),
        "fp8": run(models["planted_fp8"], probe=attention_windows, **kw),
        "fp8_window": run(fp8_window, probe=attention_windows, **kw),
        "fp8_vocab_window": run(vocab_window, probe=attention_windows, **kw),
    }


def test_prompts_are_longer_than_the_window(runs: dict[str, Run]) -> None:
    assert all(len(p) > WINDOW for p in PROMPTS)
    assert runs["nospec"].outputs == [planted_continuation(p, n=MAX_TOKENS) for p in PROMPTS]


@pytest.mark.parametrize("variant", ["fp8", "fp8_window", "fp8_vocab_window"])
def test_output_equals_plain_greedy(runs: dict[str, Run], variant: str) -> None:
    r = runs[variant]
    assert r.drafted > 0
    assert r.outputs == runs["nospec"].outputs


@pytest.mark.parametrize("variant", ["fp8_window", "fp8_vocab_window"])
def test_only_the_drafter_carries_the_window(runs: dict[str, Run], variant: str) -> None:
    windows = runs[variant].extra["probe"]
    assert windows["drafter"] and set(windows["drafter"].values()) == {WINDOW}
    assert windows["target"] and set(windows["target"].values()) == {None}


def test_without_the_setting_nothing_is_windowed(runs: dict[str, Run]) -> None:
    windows = runs["fp8"].extra["probe"]
    assert windows["drafter"] and set(windows["drafter"].values()) == {None}
    assert set(windows["target"].values()) == {None}


def test_window_with_fp8_drafter_and_truncated_head(runs: dict[str, Run]) -> None:
    r = runs["fp8_vocab_window"]
    assert r.modules["model.draft_lm_head"][1] == "torch.float8_e4m3fn"
    fc = r.modules["model.fc"]
    assert fc[1] == "torch.float8_e4m3fn" and fc[3] == EXPECTED_CPU_FP8_KERNEL
    assert r.acceptance >= 0.95, f"{r.accepted}/{r.drafted}"  # the planted drafter barely uses attention


def test_window_reaches_the_cpu_attention_kernel(models: dict[str, Path], tmp_path: Path) -> None:
    """A drafter that leans on its attention drafts differently with a tiny window."""
    import shutil

    from fixtures.attention_drafter import amplify_drafter_attention

    src = tmp_path / "attn"
    shutil.copytree(models["planted"], src)
    amplify_drafter_attention(src, 30.0)
    full = run(quantize_mtp(src, tmp_path / "full"), prompts=PROMPTS, max_tokens=MAX_TOKENS)
    small = run(
        quantize_mtp(src, tmp_path / "w4", "--draft-window", "4"), prompts=PROMPTS, max_tokens=MAX_TOKENS
    )
    expected = [planted_continuation(p, n=MAX_TOKENS) for p in PROMPTS]
    assert full.outputs == small.outputs == expected
    assert (small.accepted, small.drafted) != (full.accepted, full.drafted)
