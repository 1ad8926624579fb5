"""DeepSeek-V4 beyond the parametrized family tests: its released form is already converted.

DeepSeek's releases and NVIDIA's ``-NVFP4`` ones store every drafter linear FP8 (128x128 blocks,
``quant_method: fp8``); inspect must report that drafter as FP8 and quantize-mtp refuse it,
rather than treat it as a source.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.family_deepseek_v4 import write_deepseek_v4_release
from mtpconv.commands.inspect import inspect_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.errors import ConversionError
from tests.helpers import raw_tensors, tree_digest


def test_a_released_deepseek_v4_reports_its_drafter_fp8_and_is_not_converted(tmp_path: Path) -> None:
    src = write_deepseek_v4_release(tmp_path / "src")
    tensors = raw_tensors(src)
    report = inspect_checkpoint(str(src))
    assert report.family == "deepseek_v4"
    assert report.mtp_layers_found == report.mtp_layers_declared == 1
    linears = [r for r in report.drafter if r.role == "linear"]
    # e_proj, h_proj, 5 attention linears, 4 experts x 3, shared w1/w2/w3
    assert len(linears) == 2 + 5 + 12 + 3
    for r in linears:
        assert r.format == "fp8", r.name
        assert tensors[r.name][0] == "F8_E4M3"
    stored = [f for f in report.findings if f.code == "drafter-stored-fp8"]
    assert len(stored) == 1 and "nothing to convert" in stored[0].message
    assert not [f for f in report.findings if f.code == "drafter-declared-quantized"]
    # embed / head and the quant_config=None compressor and indexer layers are never FP8 in
    # vLLM: stored BF16 under an fp8 config is right, not an error to "fix"
    assert not [f for f in report.findings if f.severity.value == "error"], report.findings
    digest = tree_digest(src)
    with pytest.raises(ConversionError, match="already has an FP8 drafter"):
        quantize_mtp(str(src), tmp_path / "dst", device="cpu")
    assert not (tmp_path / "dst").exists()
    assert tree_digest(src) == digest


def test_fix_exclusions_leaves_a_released_deepseek_v4_as_it_is(tmp_path: Path) -> None:
    from mtpconv.commands.fix_exclusions import fix_exclusions

    src = write_deepseek_v4_release(tmp_path / "src")
    report = fix_exclusions(str(src), tmp_path / "fixed", dry_run=True)
    assert not report.excluded and not report.modules, (report.excluded, report.modules)
