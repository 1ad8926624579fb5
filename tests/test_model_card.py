"""The generated model card: front matter, byte counts, error stats, vocab, license."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from huggingface_hub import ModelCard

from mtpconv.errors import ManifestError
from mtpconv.manifest import write_manifest
from mtpconv.model_card import build_model_card, find_license
from tests.publish_support import isolate_hub, make_variant  # noqa: F401  (autouse fixture)

REPO = "alice/Tiny-MTP-mtpfp8"


def _split(card: str) -> tuple[dict[str, Any], str]:
    assert card.startswith("---\n")
    front, body = card[4:].split("\n---\n", 1)
    meta = yaml.safe_load(front)
    assert isinstance(meta, dict)
    return meta, body


def test_front_matter_exact(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v")
    meta, _ = _split(build_model_card(directory, manifest, REPO))
    assert meta == {
        "base_model": "acme/Tiny-MTP",
        "base_model_relation": "quantized",
        "library_name": "vllm",
        "tags": ["mtp", "fp8", "speculative-decoding", "vllm"],
    }


def test_huggingface_hub_parses_the_card(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v", readme="---\nlicense: mit\n---\n")
    card = ModelCard(build_model_card(directory, manifest, REPO))
    data: dict[str, Any] = card.data.to_dict()  # type: ignore[no-untyped-call]
    assert data["base_model"] == "acme/Tiny-MTP"
    assert data["license"] == "mit"
    assert data["library_name"] == "vllm"
    assert data["base_model_relation"] == "quantized"


def test_bytes_before_and_after_from_headers(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v")
    _, body = _split(build_model_card(directory, manifest, REPO))
    # fc [32, 64] + q_proj [32, 32] FP8 = 3072 B, + two 4-byte scales; BF16 = 2 x 3072 B.
    assert "| 2 drafter linears | 6.00 KiB if BF16 ¹ | 3.01 KiB (FP8 + scales) |" in body
    assert "¹ The same weights at 2 bytes each; `mtpconv.json` does not record" in body
    # full head [256, 32] BF16 = 16384 B; draft head [64, 32] FP8 + scale = 2052 B.
    assert (
        "| LM head used by the drafter | 16.00 KiB (`lm_head.weight` [256, 32], BF16) "
        "| 2.00 KiB (`mtp.draft_lm_head.weight` [64, 32], fp8) |"
    ) in body


def test_error_statistics(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v")
    _, body = _split(build_model_card(directory, manifest, REPO))
    assert "| max relative L2 error | 3.500e-02 | `mtp.layers.0.self_attn.q_proj` |" in body
    assert "| mean relative L2 error | 2.800e-02 | over 2 tensors |" in body
    assert "| max absolute error | 4.000e-03 | `mtp.fc` |" in body


def test_error_statistics_not_recorded(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v", errors={})
    _, body = _split(build_model_card(directory, manifest, REPO))
    assert "## FP8 quantization error\n\nNot recorded in `mtpconv.json`." in body


def test_draft_vocabulary_section(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v")
    _, body = _split(build_model_card(directory, manifest, REPO))
    assert "- 64 token ids (`mtp_draft_vocab_ids.pt`), head `mtp.draft_lm_head.weight` in fp8." in body
    assert "- Coverage of the corpus: 97.31%." in body
    assert "- Corpus: name: tiny-corpus, documents: 1,200, tokens: 345,678." in body


def test_draft_vocabulary_built_from_generated_text(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v")
    assert manifest.draft_vocab is not None
    manifest.draft_vocab.corpus = {
        "files": [],
        "tokens": 0,
        "generated": {"prompts": 64, "tokens": 4096, "coverage": 0.9875},
        "eval_generated": {"prompts": 32, "tokens": 2048, "coverage": 0.97},
    }
    _, body = _split(build_model_card(directory, manifest, REPO))
    assert "- Coverage of text the model generates: 98.75% (4,096 tokens generated for 64 prompts)." in body
    assert "- Coverage of text the model generates for held-out prompts: 97.00% (2,048 tokens)." in body
    assert "- Corpus: files: [], tokens: 0." in body


def test_without_draft_vocabulary(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v", draft_vocab=False)
    _, body = _split(build_model_card(directory, manifest, REPO))
    assert "None: the drafter scores the full vocabulary." in body
    assert "LM head used by the drafter" not in body


def test_usage_commands_exact(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v")
    _, body = _split(build_model_card(directory, manifest, REPO))
    assert (
        "```bash\n"
        'pip install "mtpconv[vllm]"\n'
        f"vllm serve {REPO} --speculative-config "
        '\'{"method":"mtp","num_speculative_tokens":2}\'\n'
        "```"
    ) in body


def test_local_source_has_no_base_model(tmp_path: Path) -> None:
    src: dict[str, Any] = {
        "path": "/data/Qwen3.5-Tiny",
        "repo_id": None,
        "revision": None,
        "files": {},
    }
    directory, manifest = make_variant(tmp_path / "v", source=src)
    meta, body = _split(build_model_card(directory, manifest, REPO))
    assert "base_model" not in meta and "base_model_relation" not in meta
    assert "The local checkpoint `Qwen3.5-Tiny` with its" in body
    assert "/data" not in body


def test_license_from_source_readme_with_link_made_absolute(tmp_path: Path) -> None:
    readme = "---\nlicense: other\nlicense_name: tiny\nlicense_link: LICENSE\n---\n# src\n"
    directory, manifest = make_variant(tmp_path / "v", readme=readme)
    meta, body = _split(build_model_card(directory, manifest, REPO))
    assert meta["license"] == "other" and meta["license_name"] == "tiny"
    assert meta["license_link"] == "https://huggingface.co/acme/Tiny-MTP/blob/abc123/LICENSE"
    assert "carried over from the source's `README.md`" in body


def test_license_link_kept_relative_when_the_file_travels(tmp_path: Path) -> None:
    readme = "---\nlicense: other\nlicense_name: tiny\nlicense_link: LICENSE\n---\n"
    directory, manifest = make_variant(tmp_path / "v", readme=readme, license_file=True)
    meta, _ = _split(build_model_card(directory, manifest, REPO))
    assert meta["license_link"] == "LICENSE"


def test_license_from_manifest(tmp_path: Path) -> None:
    src: dict[str, Any] = {
        "repo_id": "acme/Tiny-MTP",
        "revision": None,
        "path": None,
        "license": "apache-2.0",
    }
    directory, manifest = make_variant(tmp_path / "v", source=src)
    meta, body = _split(build_model_card(directory, manifest, REPO))
    assert meta["license"] == "apache-2.0"
    assert "carried over from the source's `mtpconv.json`" in body


def test_license_file_only_is_pointed_to_not_named(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v", license_file=True)
    meta, body = _split(build_model_card(directory, manifest, REPO))
    assert "license" not in meta
    assert "- License: see `LICENSE`, copied from the source." in body
    assert find_license(directory, manifest).found_in == "LICENSE"


def test_license_unknown_is_said_not_invented(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v", readme="# no front matter\n")
    meta, body = _split(build_model_card(directory, manifest, REPO))
    assert "license" not in meta
    assert "- License: unknown" in body


def test_linear_missing_from_headers_is_a_manifest_error(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v")
    manifest.drafter.fp8_linears.append("mtp.layers.0.mlp.down_proj")
    write_manifest(directory, manifest)
    with pytest.raises(ManifestError, match=r"mtp\.layers\.0\.mlp\.down_proj\.weight"):
        build_model_card(directory, manifest, REPO)
