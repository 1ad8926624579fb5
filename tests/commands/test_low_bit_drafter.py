"""A drafter already stored below 8 bits is not silently made larger (issue 47).

llm-compressor's ``model_free_ptq`` NVFP4A16 quantizes a dense Qwen3.5's drafter linears
with the target (weights-only NVFP4, compressed-tensors); ModelOpt exports can store them
NVFP4 too. FP8 would make them larger: quantize-mtp refuses by default with one error naming
the stored format and the sizes, converts when asked to, and inspect says the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.inspect import inspect_checkpoint
from mtpconv.low_bit_drafter import CODE_LOW_BIT_DRAFTER, CODE_UNREADABLE_DRAFTER
from mtpconv.units import human_bytes
from tests.helpers import run_cli, tree_digest


def _nvfp4a16(root: Path) -> Path:
    """model_free_ptq's NVFP4A16 on a dense Qwen3.5: weights-only NVFP4, drafter included."""
    src = write_checkpoint(root, Spec(family="qwen3_5", quant="ct_nvfp4", drafter_quant="ct_nvfp4"))
    cfg = json.loads((src / "config.json").read_text())
    group = cfg["quantization_config"]["config_groups"]["group_0"]
    group["input_activations"] = None  # A16: the scheme quantizes weights only
    (src / "config.json").write_text(json.dumps(cfg, indent=2))
    return src


def _exported(mode: str) -> Callable[[Path], Path]:
    """A dense Qwen3.5 whose target and drafter linears are all stored as ``mode``."""
    return lambda d: write_checkpoint(d, Spec(family="qwen3_5", quant=mode, drafter_quant=mode))


SOURCES = {
    "nvfp4a16-compressed-tensors": (_nvfp4a16, "NVFP4 (4-bit, compressed-tensors)"),
    "nvfp4-modelopt": (
        lambda d: write_checkpoint(
            d, Spec(family="qwen3_5", quant="nvfp4", drafter_quant="nvfp4", exclude=["lm_head"])
        ),
        "NVFP4 (4-bit, ModelOpt)",
    ),
}
# Sub-8-bit storages mtpconv recognises but cannot dequantize: llm-compressor's W4A16
# (symmetric: the width is only in the config group; asymmetric: its zero points tell it),
# its MXFP4, and GPTQ's qweight.
UNREADABLE = {
    "w4a16-compressed-tensors": (_exported("ct_w4a16"), "INT4 (compressed-tensors pack-quantized)"),
    "w4a16-asym-compressed-tensors": (
        _exported("ct_w4a16_asym"),
        "INT4 (compressed-tensors pack-quantized)",
    ),
    "mxfp4-compressed-tensors": (_exported("ct_mxfp4"), "MXFP4 (4-bit, compressed-tensors)"),
    "gptq-int4": (_exported("gptq"), "INT4 (GPTQ/AWQ qweight)"),
}
# the 8 drafter linears of the tiny dense Qwen3.5, unpacked: fc [64, 128], q [128, 64] (gated),
# k/v [32, 64], o [64, 64], gate/up [128, 64], down [64, 128]: weights 1 byte each, plus one
# float32 scale per output row (compressed-tensors' channel layout; GPTQ: ModelOpt's per channel)
_FP8_WEIGHTS = 64 * 128 + 128 * 64 + 2 * 32 * 64 + 64 * 64 + 2 * 128 * 64 + 64 * 128
_FP8_SCALES = 4 * (64 + 128 + 32 + 32 + 64 + 128 + 128 + 64)


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_a_4bit_drafter_is_refused_by_default(kind: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    make, stored = SOURCES[kind]
    src = make(tmp_path / "src")
    before = tree_digest(src)
    code, _, err = run_cli(["quantize-mtp", str(src), str(tmp_path / "out" / "v")], capsys)
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert code == 1 and len(errors) == 1, err
    assert stored in errors[0] and "now" in errors[0] and "as FP8" in errors[0] and "KiB" in errors[0]
    assert errors[0].endswith("to convert it anyway, pass --fp8-from-4bit."), errors[0]
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


def _one_error(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
def test_a_drafter_mtpconv_cannot_read_is_refused_with_or_without_fp8(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make, stored = UNREADABLE[kind]
    src = make(tmp_path / "src")
    before = tree_digest(src)
    fp8 = human_bytes(_FP8_WEIGHTS + _FP8_SCALES)

    code, _, err = run_cli(["quantize-mtp", str(src), str(tmp_path / "out" / "v")], capsys)
    error = _one_error(err)
    assert code == 1
    assert f"8 of the drafter's 8 linears are already stored {stored}" in error, error
    assert f"{fp8} as FP8" in error and "now" in error, error
    assert f"mtpconv cannot read {stored} drafters yet" in error, error

    code, _, err = run_cli(["quantize-mtp", str(src), str(tmp_path / "out" / "v"), "--fp8-from-4bit"], capsys)
    error = _one_error(err)
    assert code == 1 and f"mtpconv cannot read {stored} drafters yet" in error, error
    assert "e.g. mtp." in error, error  # names one of the drafter's weights
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert tree_digest(src) == before

    report = inspect_checkpoint(str(src))
    (finding,) = [f for f in report.findings if f.code == CODE_LOW_BIT_DRAFTER]
    assert stored in finding.message and f"{fp8} as FP8" in finding.message
    assert not [f for f in report.findings if f.severity.value == "error"], report.findings


def test_an_8_bit_drafter_mtpconv_cannot_read_is_not_below_8_bits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llm-compressor's W8A16 (pack-quantized, 4 int8 an int32): FP8 would not grow it, but
    mtpconv cannot read it: one error naming INT8, and inspect says so."""
    src = _exported("ct_w8a16")(tmp_path / "src")
    code, _, err = run_cli(["quantize-mtp", str(src), str(tmp_path / "v")], capsys)
    error = _one_error(err)
    assert code == 1 and "INT8 (compressed-tensors pack-quantized)" in error and "as FP8" not in error
    findings = inspect_checkpoint(str(src)).findings
    assert all(f.code != CODE_LOW_BIT_DRAFTER for f in findings)
    (finding,) = [f for f in findings if f.code == CODE_UNREADABLE_DRAFTER]
    assert "mtpconv cannot read INT8 (compressed-tensors pack-quantized) drafters yet" in finding.message
