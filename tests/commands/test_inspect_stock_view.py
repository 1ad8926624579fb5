"""inspect's per-module table of how stock vLLM reads the drafter, through the CLI.

For a source it shows what quantize-mtp would declare; for the variant, what the
variant's configs declare: the two must agree row for row, and agree with the
algorithms the variant's manifest records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.manifest import read_manifest
from tests.helpers import run_cli

CASES = {
    "qwen3_5_nvfp4": Spec(family="qwen3_5", quant="nvfp4"),
    "qwen3_5_moe_nvfp4": Spec(family="qwen3_5_moe", quant="nvfp4"),
    "deepseek_v3_nvfp4": Spec(family="deepseek_v3", quant="nvfp4"),
    "mimo_bf16": Spec(family="mimo"),
    "qwen3_5_moe_ct_nvfp4": Spec(family="qwen3_5_moe", quant="ct_nvfp4"),
    "deepseek_v3_mla_fp8_kv": Spec(family="deepseek_v3", quant="nvfp4", extra_config={"kv_lora_rank": 16}),
}


def _stock(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run_cli(["inspect", str(path), "--json"], capsys)
    assert code == 0, err
    view: dict[str, Any] = json.loads(out)["stock_vllm"]
    return view


def _by_kind(view: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for row in view["modules"]:
        out.setdefault(row["kind"], set()).add(row["gets"])
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_source_and_variant_views_agree(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = CASES[case]
    src = write_checkpoint(tmp_path / "src", spec)
    source = _stock(src, capsys)
    assert source["of"] == "source"
    quantize_mtp(str(src), tmp_path / "dst", device="cpu")
    variant = _stock(tmp_path / "dst", capsys)
    assert variant["of"] == "variant"
    assert variant["declaration"] == source["declaration"]
    key = [(r["module"], r["kind"], r["gets"], r["modules"]) for r in source["modules"]]
    assert key == [(r["module"], r["kind"], r["gets"], r["modules"]) for r in variant["modules"]]

    manifest = read_manifest(tmp_path / "dst")
    assert manifest is not None
    kinds = _by_kind(variant)
    # Every stored drafter linear has a row (experts folded per projection).
    assert sum(r["modules"] for r in variant["modules"]) == len(manifest.drafter.fp8_linears) + len(
        manifest.drafter.kept_bf16
    )
    # The plain nn.Linear modules of DeepSeek (eh_proj) / MiMo (input_proj) stay BF16.
    plain = {r["module"] for r in variant["modules"] if r["kind"] == "plain nn.Linear"}
    assert plain == set(manifest.drafter.kept_bf16)
    assert kinds.get("plain nn.Linear", {"BF16"}) == {"BF16"}
    if case == "deepseek_v3_mla_fp8_kv":
        # Exclusion style: stock vLLM refuses the FP8 linears loudly, never reads them BF16.
        assert source["declaration"] == "exclusion" and "MLAAttention" in source["reason"]
        assert kinds["dense linear"] == kinds["routed experts"] == {"refuses to load"}
    elif spec.quant == "ct_nvfp4":
        assert kinds["dense linear"] == kinds["routed experts"] == {"FP8"}
    else:
        assert kinds["dense linear"] == {"FP8_PER_CHANNEL_PER_TOKEN"}
        assert kinds.get("routed experts", {"FP8_PB_WO"}) == {"FP8_PB_WO"}
        declared = set(manifest.drafter.declared_algorithms.values())
        assert declared == kinds["dense linear"] | kinds.get("routed experts", set())


def test_table_names_kind_and_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="deepseek_v3", quant="nvfp4"))
    code, out, _ = run_cli(["inspect", str(src)], capsys)
    assert code == 0
    assert "How stock vLLM reads the drafter (what quantize-mtp would declare)" in out
    flat = " ".join(out.split())
    assert "plain nn.Linear" in flat and "routed experts" in flat and "FP8_PB_WO" in flat
    assert "no FP8 possible" in flat  # why eh_proj stays BF16


def test_no_drafter_no_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5", write_mtp=False, declare_mtp=False))
    code, out, _ = run_cli(["inspect", str(src), "--json"], capsys)
    assert code == 0 and json.loads(out)["stock_vllm"] is None
