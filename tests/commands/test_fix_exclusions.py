"""fix-exclusions through the CLI: what it writes and what it reports, in both modes.

The regression: a VLM config whose quantization lives only under
``text_config.quantization_config`` (no hf_quant_config.json). fix-exclusions used to
re-read exclusions by hand (``exclude_modules`` / top-level ``ignore`` only): --in-place
reported nothing and left mtp.fc declared NVFP4; DST mode wrote the fix but reported
nothing excluded.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.quantconfig.declarations import declared_algorithm, declared_quant
from mtpconv.quantconfig.documents import load_quant_configs
from tests.helpers import run_cli, tree_digest

IGNORE = ("text_config", "quantization_config", "ignore")
TARGET_EXPERT = "model.language_model.layers.1.mlp.experts.0.up_proj"


@pytest.fixture(scope="module")
def text_config_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NVFP4 Qwen3.5-MoE VLM with the mtp.fc gap, declared only in text_config."""
    src = write_checkpoint(
        tmp_path_factory.mktemp("text_config_only"),
        Spec(family="qwen3_5_moe", quant="nvfp4", vlm=True, shards=2),
    )
    cfg = json.loads((src / "config.json").read_text())
    cfg["text_config"]["quantization_config"] = cfg.pop("quantization_config")
    (src / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (src / "hf_quant_config.json").unlink()
    return src


def _without_ignore(cfg: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    del out["text_config"]["quantization_config"]["ignore"]
    return out


def _check_fixed(before: dict[str, Any], directory: Path) -> None:
    """mtp.fc excluded where the config declares it, nothing else changed, no file added."""
    after = json.loads((directory / "config.json").read_text())
    assert after["text_config"]["quantization_config"]["ignore"] == [
        *before["text_config"]["quantization_config"]["ignore"],
        "mtp.fc",
    ]
    assert _without_ignore(after) == _without_ignore(before)
    assert list(after) == list(before)  # key order kept, no top-level quantization_config
    assert not (directory / "hf_quant_config.json").exists()
    decl = declared_quant(load_quant_configs(directory))
    assert decl.source == "config.json (text_config)"
    assert declared_algorithm(decl, "mtp.fc") is None
    assert declared_algorithm(decl, TARGET_EXPERT) == "NVFP4"


def test_source_has_the_gap(text_config_only: Path) -> None:
    decl = declared_quant(load_quant_configs(text_config_only))
    assert declared_algorithm(decl, "mtp.fc") == "NVFP4"


def test_dst_mode_fixes_and_reports(
    text_config_only: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = json.loads((text_config_only / "config.json").read_text())
    digest = tree_digest(text_config_only)
    dst = tmp_path / "fixed"
    code, out, err = run_cli(["fix-exclusions", str(text_config_only), str(dst), "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["newly_excluded"] == ["mtp.fc"]
    assert report["excluded_modules"] == ["mtp.fc"]
    assert report["edits"] == [
        {"file": "config.json", "key": "text_config.quantization_config.ignore", "added": ["mtp.fc"]}
    ]
    assert tree_digest(text_config_only) == digest  # the source is untouched
    _check_fixed(before, dst)
    code, out, _ = run_cli(["inspect", str(dst), "--json"], capsys)
    assert code == 0
    assert not [f for f in json.loads(out)["findings"] if f["severity"] == "error"]


def test_dst_mode_table_lists_what_was_excluded(
    text_config_only: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["fix-exclusions", str(text_config_only), str(tmp_path / "fixed")], capsys)
    assert code == 0, err
    assert "Excluded" in out and "mtp.fc" in out and "Nothing to fix" not in out


def test_in_place_fixes_reports_and_keeps_bak(
    text_config_only: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy_dir = tmp_path / "copy"
    shutil.copytree(text_config_only, copy_dir)
    original = (copy_dir / "config.json").read_bytes()
    before = json.loads(original)
    code, out, err = run_cli(["fix-exclusions", str(copy_dir), "--in-place", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["newly_excluded"] == ["mtp.fc"] and report["excluded_modules"] == ["mtp.fc"]
    assert report["backups"] == [str(copy_dir / "config.json.bak")]
    assert (copy_dir / "config.json.bak").read_bytes() == original
    assert not (copy_dir / "hf_quant_config.json.bak").exists()
    _check_fixed(before, copy_dir)
    # a second run has nothing to do and keeps the first backup (the original)
    code, out, err = run_cli(["fix-exclusions", str(copy_dir), "--in-place"], capsys)
    assert code == 0, err
    assert "Nothing to fix" in out
    assert (copy_dir / "config.json.bak").read_bytes() == original


def test_library_takes_in_place_as_an_explicit_target(text_config_only: Path, tmp_path: Path) -> None:
    from mtpconv.commands.fix_exclusions import IN_PLACE, fix_exclusions

    copy_dir = tmp_path / "copy"
    shutil.copytree(text_config_only, copy_dir)
    report = fix_exclusions(str(copy_dir), IN_PLACE)
    assert report.in_place and report.destination == str(copy_dir)
    assert report.backups == [str(copy_dir / "config.json.bak")]


def test_hub_snapshot_cannot_be_edited_in_place_and_the_message_names_no_flag(
    monkeypatch: pytest.MonkeyPatch, text_config_only: Path
) -> None:
    import mtpconv.commands.fix_exclusions as command
    from mtpconv.checkpoint.source import Source
    from mtpconv.errors import OutputError

    snapshot = Source(spec="acme/tiny", directory=text_config_only, repo_id="acme/tiny")
    monkeypatch.setattr(command, "resolve_source", lambda spec, revision: snapshot)
    with pytest.raises(OutputError, match="acme/tiny is a Hub repo") as info:
        command.fix_exclusions("acme/tiny", command.IN_PLACE)
    assert "--" not in str(info.value)


def test_dry_run_reports_and_writes_nothing(
    text_config_only: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy_dir = tmp_path / "copy"
    shutil.copytree(text_config_only, copy_dir)
    digest = tree_digest(copy_dir)
    code, out, err = run_cli(["fix-exclusions", str(copy_dir), "--in-place", "--dry-run"], capsys)
    assert code == 0, err
    assert "Would exclude" in out and "mtp.fc" in out
    assert tree_digest(copy_dir) == digest


def test_both_files_report_both_edits(
    nvfp4_vlm_moe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["fix-exclusions", str(nvfp4_vlm_moe), str(tmp_path / "f"), "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["newly_excluded"] == ["mtp.fc"]
    assert [(e["file"], e["key"], e["added"]) for e in report["edits"]] == [
        ("config.json", "quantization_config.ignore", ["mtp.fc"]),
        ("hf_quant_config.json", "quantization.exclude_modules", ["mtp.fc"]),
    ]
