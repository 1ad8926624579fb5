"""The draft attention window: ``quantize-mtp --draft-window``, ``set-draft-window``,
what ``inspect``, the model card and ``publish`` make of it (issue 16)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fixtures.checkpoints import write_checkpoint
from mtpconv.commands.publish import plan_publish
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.commands.set_draft_window import set_draft_window, with_window
from mtpconv.errors import DraftWindowError, ManifestError
from mtpconv.manifest import MANIFEST_NAME, max_context, parse_manifest, read_manifest
from mtpconv.model_card import build_model_card
from tests.helpers import run_cli, tree_digest
from tests.publish_support import isolate_hub  # noqa: F401

MAX_CONTEXT = 4096


def _source(root: Path, *, vlm: bool) -> Path:
    """A tiny checkpoint whose config.json states a max context (under text_config for a VLM)."""
    src = write_checkpoint(root / "src", family="qwen3_5_moe", vlm=vlm)
    path = src / "config.json"
    cfg = json.loads(path.read_text())
    (cfg["text_config"] if vlm else cfg)["max_position_embeddings"] = MAX_CONTEXT
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    return src


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("window_sources")
    return {"plain": _source(root / "plain", vlm=False), "vlm": _source(root / "vlm", vlm=True)}


@pytest.fixture
def variant(sources: dict[str, Path], tmp_path: Path) -> Path:
    dst = tmp_path / "Tiny-mtpfp8"
    quantize_mtp(str(sources["vlm"]), dst)
    return dst


def test_quantize_records_the_window(sources: dict[str, Path], tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    dst = tmp_path / "out"
    code, out, _ = run_cli(["quantize-mtp", str(sources["plain"]), str(dst), "--draft-window", "512"], capsys)
    assert code == 0 and "draft attention window" in out
    assert read_manifest(dst).draft_window == 512  # type: ignore[union-attr]
    doc = json.loads((dst / MANIFEST_NAME).read_text())
    assert list(doc).index("draft_window") == list(doc).index("drafter") + 1


def test_quantize_without_window_writes_no_key(variant: Path) -> None:
    doc = json.loads((variant / MANIFEST_NAME).read_text())
    assert "draft_window" not in doc
    assert read_manifest(variant).draft_window is None  # type: ignore[union-attr]


@pytest.mark.parametrize("window", [MAX_CONTEXT, MAX_CONTEXT + 1])
def test_quantize_refuses_a_window_not_below_max_context(
    sources: dict[str, Path],
    tmp_path: Path,
    capsys,
    window: int,  # type: ignore[no-untyped-def]
) -> None:
    dst = tmp_path / "out"
    args = ["quantize-mtp", str(sources["vlm"]), str(dst), "--draft-window", str(window)]
    code, out, err = run_cli(args, capsys)
    assert code == 2 and not dst.exists() and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and str(MAX_CONTEXT) in lines[0]
    assert list(tmp_path.iterdir()) == []  # no temporary directory left either


def test_quantize_refuses_zero_before_reading(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(
        ["quantize-mtp", str(tmp_path / "nowhere"), str(tmp_path / "o"), "--draft-window", "0"], capsys
    )
    assert code == 2 and err.startswith("Error:") and "--draft-window" in err


def test_set_and_clear_rewrite_only_the_manifest(variant: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    before = tree_digest(variant)
    original = (variant / MANIFEST_NAME).read_bytes()
    code, out, _ = run_cli(["set-draft-window", str(variant), "64"], capsys)
    assert code == 0 and "full -> 64 tokens" in out
    after = tree_digest(variant)
    assert {k for k in before if before[k] != after[k]} == {MANIFEST_NAME}
    assert set(after) == set(before)  # no temporary file left
    assert read_manifest(variant).draft_window == 64  # type: ignore[union-attr]
    code, out, _ = run_cli(["set-draft-window", str(variant), "128", "--json"], capsys)
    assert code == 0 and json.loads(out) == {
        "manifest": str(variant / MANIFEST_NAME),
        "previous": 64,
        "draft_window": 128,
        "changed": True,
    }
    code, _, _ = run_cli(["set-draft-window", str(variant), "--clear"], capsys)
    assert code == 0 and (variant / MANIFEST_NAME).read_bytes() == original
    set_draft_window(variant, 32)
    code, _, _ = run_cli(["set-draft-window", str(variant), "0"], capsys)  # 0 clears too
    assert code == 0 and (variant / MANIFEST_NAME).read_bytes() == original


def test_unchanged_window_writes_nothing(variant: Path) -> None:
    set_draft_window(variant, 16)
    stat = (variant / MANIFEST_NAME).stat()
    report = set_draft_window(variant, 16)
    assert not report.changed and report.previous == report.window == 16
    assert (variant / MANIFEST_NAME).stat().st_mtime_ns == stat.st_mtime_ns


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["4096"], "max context 4096"),
        (["99999"], "max context 4096"),
        (["5", "--clear"], "not both"),
        ([], "--clear"),
    ],
)
def test_set_usage_errors_write_nothing(variant: Path, capsys, args: list[str], needle: str) -> None:  # type: ignore[no-untyped-def]
    before = tree_digest(variant)
    code, out, err = run_cli(["set-draft-window", str(variant), *args], capsys)
    lines = err.strip().splitlines()
    assert (
        code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("Error:") and needle in lines[0]
    )
    assert tree_digest(variant) == before


def test_set_refuses_a_directory_without_manifest(sources: dict[str, Path], capsys) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(["set-draft-window", str(sources["plain"]), "16"], capsys)
    assert code == 1 and MANIFEST_NAME in err and "quantize-mtp" in err


def test_set_keeps_keys_it_does_not_own(variant: Path) -> None:
    path = variant / MANIFEST_NAME
    doc = json.loads(path.read_text())
    doc["future_field"] = {"kept": True}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    set_draft_window(variant, 8)
    new = json.loads(path.read_text())
    assert new["future_field"] == {"kept": True} and new["draft_window"] == 8
    assert [k for k in new if k != "draft_window"] == list(doc)


def test_publish_dry_run_accepts_the_variant_after_set(variant: Path) -> None:
    set_draft_window(variant, 256)
    plan = plan_publish(variant, offline=True)  # every check publish makes, sha256s included
    assert plan.card is not None and "sliding window of 256 tokens" in plan.card
    set_draft_window(variant, None)
    plan = plan_publish(variant, offline=True)
    assert plan.card is not None and "Draft attention window" not in plan.card


def test_inspect_shows_the_window(variant: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run_cli(["inspect", str(variant), "--json"], capsys)
    assert code == 0 and json.loads(out)["variant"]["draft_window"] is None
    set_draft_window(variant, 48)
    code, out, _ = run_cli(["inspect", str(variant), "--json"], capsys)
    assert code == 0 and json.loads(out)["variant"]["draft_window"] == 48
    code, out, _ = run_cli(["inspect", str(variant)], capsys)
    assert code == 0 and "sliding window of 48 tokens" in out


def test_card_without_window_is_unchanged(variant: Path) -> None:
    manifest = read_manifest(variant)
    assert manifest is not None
    card = build_model_card(variant, manifest, "u/x")
    assert "window" not in card.lower()


# --------------------------------------------------------------------------- the field itself


def test_old_manifest_without_field_parses(variant: Path) -> None:
    doc = json.loads((variant / MANIFEST_NAME).read_text())
    m = parse_manifest(doc)
    assert m.draft_window is None and "draft_window" not in json.loads(m.to_json())
    assert m.to_json() == (variant / MANIFEST_NAME).read_text()


@pytest.mark.parametrize("bad", [0, -4, 1.5, "16", True])
def test_manifest_refuses_a_bad_window(variant: Path, bad: object) -> None:
    doc = json.loads((variant / MANIFEST_NAME).read_text())
    with pytest.raises(ManifestError, match="draft_window"):
        parse_manifest(with_window(doc, bad))  # type: ignore[arg-type]


def test_max_context_reads_text_config_first() -> None:
    assert max_context({"max_position_embeddings": 10, "text_config": {"max_position_embeddings": 20}}) == 20
    assert max_context({"max_position_embeddings": 10}) == 10
    assert max_context({"text_config": {}}) is None


def test_window_without_max_context_is_refused(sources: dict[str, Path], tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "nomax", family="qwen3_5", max_context=None)
    with pytest.raises(DraftWindowError, match="max_position_embeddings") as info:
        quantize_mtp(str(src), tmp_path / "o", draft_window=16)
    assert info.value.exit_code == 2 and not (tmp_path / "o").exists()


def _make_read_only(directory: Path) -> Callable[[], None]:
    """Make ``directory`` refuse new files (immutable for root, mode 0555 otherwise); returns
    the undo. Skips where neither works (root on a filesystem without the immutable flag)."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return lambda: directory.chmod(0o755)
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(directory)], capture_output=True).returncode:
        pytest.skip("root on a filesystem without the immutable flag: no read-only directory here")
    return lambda: subprocess.run([chattr, "-i", str(directory)], check=True)


def test_a_read_only_variant_names_the_directory(variant: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    before = tree_digest(variant)
    undo = _make_read_only(variant)
    try:
        code, _, err = run_cli(["set-draft-window", str(variant), "64"], capsys)
        after = tree_digest(variant)
    finally:
        undo()
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert code == 1 and len(errors) == 1, err
    assert f"{variant} is not writable" in errors[0] and "mtpconv-tmp" not in errors[0], errors[0]
    assert after == before
