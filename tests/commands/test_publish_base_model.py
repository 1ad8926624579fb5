"""``publish --base-model ID`` and the card's engine section (what each engine gets)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.cli import main
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.manifest import read_manifest
from mtpconv.model_card import build_model_card
from tests.helpers import tree_digest
from tests.publish_support import isolate_hub, make_variant  # noqa: F401  (autouse fixture)

LOCAL: dict[str, Any] = {"path": "/data/Tiny-MTP", "repo_id": None, "revision": None, "files": {}}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), out, err


def _front(card: str) -> dict[str, Any]:
    meta = yaml.safe_load(card[4:].split("\n---\n", 1)[0])
    assert isinstance(meta, dict)
    return meta


def test_base_model_names_a_local_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    variant, _ = make_variant(tmp_path / "Tiny-MTP-mtpfp8", source=LOCAL)
    code, out, err = _run(["publish", str(variant), "--dry-run", "--base-model", "acme/Tiny-MTP"], capsys)
    assert code == 0, err
    card = out.split("--- README.md (generated) ---\n", 1)[1]
    meta = _front(card)
    assert meta["base_model"] == "acme/Tiny-MTP" and meta["base_model_relation"] == "quantized"
    assert "- Source: [acme/Tiny-MTP](https://huggingface.co/acme/Tiny-MTP)." in card
    assert "--model-path acme/Tiny-MTP --speculative-algorithm NEXTN" in card


def test_without_base_model_a_local_source_says_unknown(tmp_path: Path) -> None:
    variant, manifest = make_variant(tmp_path / "v", source=LOCAL)
    card = build_model_card(variant, manifest, "alice/Tiny-MTP-mtpfp8")
    assert "base_model" not in _front(card)
    assert "its base model on the Hub is unknown (none was named when it was published)" in card
    assert "--model-path <the source checkpoint>" in card


@pytest.mark.parametrize("bad", ["not a repo id", "a/b/c", "x" * 200, "--", "acme/"])
def test_malformed_base_model_is_a_usage_error(
    tmp_path: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    variant, _ = make_variant(tmp_path / "v", source=LOCAL)
    digest = tree_digest(variant)
    code, out, err = _run(["publish", str(variant), "--dry-run", f"--base-model={bad}"], capsys)
    lines = err.splitlines()
    assert code == 2 and out == ""
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "'--base-model'" in lines[0]
    assert tree_digest(variant) == digest


def test_malformed_base_model_is_checked_before_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(["publish", str(tmp_path / "missing"), "--base-model", "a b"], capsys)
    assert code == 2 and "'--base-model'" in err


def test_engines_of_a_standard_variant(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="deepseek_v3", quant="nvfp4"))
    quantize_mtp(str(src), tmp_path / "dst", device="cpu")
    manifest = read_manifest(tmp_path / "dst")
    assert manifest is not None and manifest.drafter.declaration == "standard"
    card = build_model_card(tmp_path / "dst", manifest, "alice/Tiny-mtpfp8", base_model="acme/Tiny")
    algos = sorted(set(manifest.drafter.declared_algorithms.values()))
    assert algos == ["FP8_PB_WO", "FP8_PER_CHANNEL_PER_TOKEN"]
    assert (
        f"| stock vLLM >= 0.32 (no plugin) | the FP8 drafter through its own quant config ({', '.join(algos)})"
        in card
    )
    assert "`model.layers.2.eh_proj` stay BF16 (plain `nn.Linear`)" in card
    assert (
        "| stock vLLM < 0.30 (no plugin) | refuses this variant at load: its ModelOpt MIXED_PRECISION "
        f"config builds no layer of these algorithms ({', '.join(algos)})"
    ) in card
    assert (
        "| vLLM + mtpconv plugin | the FP8 drafter on the plugin's kernels (no truncated head here) |" in card
    )
    assert "| SGLang | nothing (this variant has no draft vocabulary) |" in card
    assert "--speculative-token-map" not in card.split("## Engines", 1)[1].split("| SGLang")[0]


def test_engines_of_an_exclusion_variant_with_a_head(tmp_path: Path) -> None:
    variant, manifest = make_variant(tmp_path / "v")
    manifest = replace(manifest, drafter=replace(manifest.drafter, declaration="exclusion"))
    card = build_model_card(variant, manifest, "alice/Tiny-MTP-mtpfp8")
    assert "| stock vLLM >= 0.32 (no plugin) | refuses this variant loudly at load" in card
    assert "| stock vLLM < 0.30" not in card  # every stock vLLM refuses an exclusion-style variant
    assert manifest.draft_vocab is not None
    assert f"+ the truncated {manifest.draft_vocab.size:,}-row draft head |" in card
    assert (
        "python -m sglang.launch_server --model-path acme/Tiny-MTP --speculative-algorithm NEXTN \\\n"
        "  --speculative-token-map alice/Tiny-MTP-mtpfp8/mtp_draft_vocab_ids.pt"
    ) in card
    assert "Stock vLLM serves this checkpoint correctly or refuses it loudly, never silently wrong." in card
