"""A drafter already stored below 8 bits is not silently made larger (issue 47).

llm-compressor's ``model_free_ptq`` NVFP4A16 quantizes a dense Qwen3.5's drafter linears
with the target (weights-only NVFP4, compressed-tensors); ModelOpt exports can store them
NVFP4 too. FP8 would make them larger: quantize-mtp refuses by default with one error naming
the stored format and the sizes, converts when asked to, and inspect says the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.inspect import inspect_checkpoint
from mtpconv.low_bit_drafter import CODE_LOW_BIT_DRAFTER
from tests.helpers import run_cli, tree_digest


def _nvfp4a16(root: Path) -> Path:
    """model_free_ptq's NVFP4A16 on a dense Qwen3.5: weights-only NVFP4, drafter included."""
    src = write_checkpoint(root, Spec(family="qwen3_5", quant="ct_nvfp4", drafter_quant="ct_nvfp4"))
    cfg = json.loads((src / "config.json").read_text())
    group = cfg["quantization_config"]["config_groups"]["group_0"]
    group["input_activations"] = None  # A16: the scheme quantizes weights only
    (src / "config.json").write_text(json.dumps(cfg, indent=2))
    return src


SOURCES = {
    "nvfp4a16-compressed-tensors": (_nvfp4a16, "NVFP4 (4-bit, compressed-tensors)"),
    "nvfp4-modelopt": (
        lambda d: write_checkpoint(
            d, Spec(family="qwen3_5", quant="nvfp4", drafter_quant="nvfp4", exclude=["lm_head"])
        ),
        "NVFP4 (4-bit, ModelOpt)",
    ),
}


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_a_4bit_drafter_is_refused_by_default(kind: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    make, stored = SOURCES[kind]
    src = make(tmp_path / "src")
    before = tree_digest(src)
    code, _, err = run_cli(["quantize-mtp", str(src), str(tmp_path / "out" / "v")], capsys)
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert code == 1 and len(errors) == 1, err
    assert stored in errors[0] and "now" in errors[0] and "as FP8" in errors[0] and "KiB" in errors[0]
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert tree_digest(src) == before

    report = inspect_checkpoint(str(src))
    (finding,) = [f for f in report.findings if f.code == CODE_LOW_BIT_DRAFTER]
    assert stored in finding.message and "as FP8" in finding.message

    code, _, err = run_cli(["quantize-mtp", str(src), str(tmp_path / "v"), "--fp8-from-4bit"], capsys)
    assert code == 0, err
    assert (tmp_path / "v" / "mtpconv.json").is_file()
    assert tree_digest(src) == before


def test_a_bf16_drafter_has_no_such_finding(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5", quant="ct_nvfp4"))
    assert all(f.code != CODE_LOW_BIT_DRAFTER for f in inspect_checkpoint(str(src)).findings)
