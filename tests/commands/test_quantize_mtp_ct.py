"""quantize-mtp, inspect and the audit on a compressed-tensors (llm-compressor) NVFP4 source."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.inspect import inspect_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.formats.nvfp4 import E2M1_VALUES, dequantize_nvfp4_ct
from mtpconv.quantconfig.audit import CODE_PLAIN_DECLARED_QUANTIZED, CODE_QUANTIZED_DECLARED_PLAIN
from mtpconv.quantconfig.compressed_tensors import DRAFTER_GROUP
from tests.helpers import load_tensor, raw_tensors, tree_digest


@pytest.fixture(scope="module")
def ct_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """A sharded CT NVFP4 Qwen3.5-MoE source (NVFP4 drafter too), and its variant."""
    root = tmp_path_factory.mktemp("ct")
    src = write_checkpoint(
        root / "src", Spec(family="qwen3_5_moe", quant="ct_nvfp4", drafter_quant="ct_nvfp4", shards=3)
    )
    before = tree_digest(src)
    quantize_mtp(str(src), root / "out", device="cpu", fp8_from_4bit=True)
    return src, root / "out", before


def _drafter_packed(src: Path) -> list[str]:
    return sorted(
        n[: -len(".weight_packed")]
        for n in raw_tensors(src)
        if n.startswith("mtp.") and n.endswith(".weight_packed")
    )


def test_ct_target_is_byte_identical_and_source_untouched(ct_pair: tuple[Path, Path, dict[str, str]]) -> None:
    src, out, before = ct_pair
    assert tree_digest(src) == before
    drafter = set(_drafter_packed(src))
    assert drafter and "mtp.fc" in drafter
    s, o = raw_tensors(src), raw_tensors(out)
    target = {n: v for n, v in s.items() if n.rsplit(".", 1)[0] not in drafter}
    assert target and all(o[n] == v for n, v in target.items())
    # a shard without drafter tensors is hard-linked, not rewritten
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    untouched = {f for f in index.values()} - {index[n] for n in s if n.startswith("mtp.")}
    assert untouched
    for f in untouched:
        assert os.stat(src / f).st_ino == os.stat(out / f).st_ino


def test_ct_drafter_is_fp8_per_channel_from_the_exact_dequant(
    ct_pair: tuple[Path, Path, dict[str, str]],
) -> None:
    src, out, _ = ct_pair
    o = raw_tensors(out)
    for mod in _drafter_packed(src):
        assert not any(
            f"{mod}.{k}" in o for k in ("weight_packed", "weight_global_scale", "input_global_scale")
        )
        packed = load_tensor(src, f"{mod}.weight_packed")
        block = load_tensor(src, f"{mod}.weight_scale")
        global_scale = load_tensor(src, f"{mod}.weight_global_scale")
        w = load_tensor(out, f"{mod}.weight")
        scale = load_tensor(out, f"{mod}.weight_scale")
        assert w.dtype == torch.float8_e4m3fn and w.shape == (packed.shape[0], packed.shape[1] * 2)
        assert scale.dtype == torch.float32 and scale.shape == (w.shape[0], 1)
        assert torch.equal(scale, scale[0, 0].expand_as(scale))  # the per-tensor value, replicated
        # element [0, 1] by hand: high nibble of byte 0, block scale 0, divided by the global scale
        code = int(packed[0, 0]) >> 4
        hand = E2M1_VALUES[code] * float(block[0, 0].float()) / float(global_scale[0])
        exact = dequantize_nvfp4_ct(packed, block, global_scale)
        assert float(exact[0, 1]) == pytest.approx(hand, rel=1e-6)
        ref = quantize_fp8(exact)
        assert torch.equal(w.view(torch.uint8), ref.weight.view(torch.uint8))
        assert float(scale[0, 0]) == float(ref.scale)


def test_ct_variant_config_adds_only_the_drafter_group(ct_pair: tuple[Path, Path, dict[str, str]]) -> None:
    src, out, _ = ct_pair
    qc_src = json.loads((src / "config.json").read_text())["quantization_config"]
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert not (out / "hf_quant_config.json").exists()
    assert list(qc["config_groups"]) == ["group_0", DRAFTER_GROUP]
    assert qc["config_groups"]["group_0"] == qc_src["config_groups"]["group_0"]
    assert qc["ignore"] == qc_src["ignore"]  # nothing skipped a drafter linear
    assert {k: v for k, v in qc.items() if k != "config_groups"} == {
        k: v for k, v in qc_src.items() if k != "config_groups"
    }
    assert "re:^mtp\\.fc$" in qc["config_groups"][DRAFTER_GROUP]["targets"]


def test_inspect_and_audit_of_ct_sources(tmp_path: Path) -> None:
    """Both llm-compressor cases: drafter BF16 and ignored (clean), drafter BF16 not ignored
    (declared NVFP4 by "Linear": the mtp.fc-gap kind of error); NVFP4 drafter ignored."""
    ignored = write_checkpoint(tmp_path / "a", Spec(family="qwen3_5_moe", quant="ct_nvfp4"))
    rep = inspect_checkpoint(str(ignored))
    assert (rep.quant_method, rep.quant_algo) == ("compressed-tensors", "NVFP4")
    assert [f for f in rep.findings if f.severity == "error"] == []
    rows = {r.name: r for r in rep.drafter}
    assert rows["mtp.fc.weight"].format == "plain" and rows["mtp.fc.weight"].declared is None

    gap = write_checkpoint(
        tmp_path / "b", Spec(family="qwen3_5_moe", quant="ct_nvfp4", exclude=["lm_head", "re:.*mlp.gate$"])
    )
    codes = {(f.code, f.module) for f in inspect_checkpoint(str(gap)).findings}
    assert (CODE_PLAIN_DECLARED_QUANTIZED, "mtp.fc") in codes
    assert (CODE_PLAIN_DECLARED_QUANTIZED, "mtp.layers.0.self_attn.q_proj") in codes

    packed = write_checkpoint(
        tmp_path / "c", Spec(family="qwen3_5_moe", quant="ct_nvfp4", drafter_quant="ct_nvfp4")
    )
    rep = inspect_checkpoint(str(packed))
    assert [f for f in rep.findings if f.severity == "error"] == []
    rows = {r.name: r for r in rep.drafter}
    fc = rows["mtp.fc.weight_packed"]
    assert (fc.format, fc.role, fc.declared) == ("nvfp4", "linear", "NVFP4")
    assert rows["mtp.fc.weight_global_scale"].role == "scale"
    cfg = json.loads((packed / "config.json").read_text())
    cfg["quantization_config"]["ignore"].append("re:^mtp.*")
    (packed / "config.json").write_text(json.dumps(cfg))
    codes = {(f.code, f.module) for f in inspect_checkpoint(str(packed)).findings}
    assert (CODE_QUANTIZED_DECLARED_PLAIN, "mtp.fc") in codes


def test_ct_bf16_drafter_ignored_converts_and_declares_fp8(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5", quant="ct_nvfp4"))
    report = quantize_mtp(str(src), tmp_path / "out", device="cpu")
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert "re:^mtp.*" not in qc["ignore"] and DRAFTER_GROUP in qc["config_groups"]
    findings = inspect_checkpoint(str(tmp_path / "out")).findings
    assert [f for f in findings if f.severity == "error"] == []
    fc = load_tensor(tmp_path / "out", "mtp.fc.weight_scale")
    assert fc.shape == (load_tensor(tmp_path / "out", "mtp.fc.weight").shape[0], 1)
    assert report.max_rel_l2 < 0.1


def test_ct_fused_3d_experts_are_declared_by_the_names_vllm_asks(tmp_path: Path) -> None:
    """Fused experts stay fused (vLLM's routed-experts loader splits them, issue 47); the
    drafter group names them as vLLM's compressed-tensors MoE method looks them up."""
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5_moe", quant="ct_nvfp4", fused_experts=True))
    quantize_mtp(str(src), tmp_path / "out", device="cpu")
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    targets = qc["config_groups"][DRAFTER_GROUP]["targets"]
    for proj in ("gate", "up", "down"):
        assert f"re:^mtp\\.layers\\.0\\.mlp\\.experts\\.\\d+\\.{proj}_proj$" in targets
    assert not any("gate_up_proj" in t or t.endswith("experts\\.down_proj$") for t in targets)
    o = raw_tensors(tmp_path / "out")
    assert o["mtp.layers.0.mlp.experts.gate_up_proj"][0] == "F8_E4M3"
    assert o["mtp.layers.0.mlp.experts.gate_up_proj_scale"][1] == [4, 256, 1]


def test_ct_vlm_source_targets_the_drafter_by_its_mtp_name(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5_moe", quant="ct_nvfp4", vlm=True))
    quantize_mtp(str(src), tmp_path / "out", device="cpu")
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    targets = qc["config_groups"][DRAFTER_GROUP]["targets"]
    assert "re:^mtp\\.fc$" in targets and all(t.startswith("re:^mtp\\.") for t in targets)
    assert qc["ignore"] == ["lm_head", "re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$", "re:.*visual.*"]
    s, o = raw_tensors(src), raw_tensors(tmp_path / "out")
    assert all(o[n] == v for n, v in s.items() if not n.startswith("mtp."))
