"""quantize-mtp and fix-exclusions against the variant contract (DESIGN §5)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.fix_exclusions import fix_exclusions
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.errors import ConversionError, OutputError
from mtpconv.formats.nvfp4 import dequantize_nvfp4
from mtpconv.layouts import module_of
from mtpconv.manifest import read_manifest
from mtpconv.quantconfig.declarations import declared_algorithm, declared_quant
from mtpconv.quantconfig.documents import load_quant_configs
from mtpconv.variant_check import bad_files
from tests.helpers import load_tensor, raw_tensors, run_cli, tree_digest


def _is_drafter(name: str) -> bool:
    return name.startswith("mtp.")


def _check_variant(src: Path, dst: Path) -> None:
    before, after = raw_tensors(src), raw_tensors(dst)
    manifest = read_manifest(dst)
    assert manifest is not None
    fp8 = set(manifest.drafter.fp8_linears)
    for name, (dtype, shape, data) in before.items():
        module = module_of(name)
        if not _is_drafter(name):
            assert after[name] == (dtype, shape, data), f"{name} changed"
        elif module in fp8 and (name.endswith(".weight") or name == module):
            q_dtype, q_shape, _ = after[name]
            assert q_dtype == "F8_E4M3"
            # Routed experts: 128x128 block scales under vLLM's block-MoE name; the rest
            # one scale per output channel (DESIGN §5: the per-tensor value, replicated).
            inv = "_inv" if ".experts." in f"{module}." else ""
            scale_name = f"{module}.weight_scale{inv}" if name.endswith(".weight") else f"{name}_scale{inv}"
            assert after[scale_name][0] == "F32"
            if dtype == "BF16" and len(shape) == 2 and not inv:
                assert after[scale_name][1] == [shape[0]]
                assert q_shape == shape
                w = load_tensor(src, name).float()
                scale = w.abs().max() / 448.0
                expected = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
                got = load_tensor(dst, name)
                assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), name
                stored = load_tensor(dst, f"{module}.weight_scale")
                assert torch.equal(stored, torch.full((shape[0],), float(scale)))
        elif module in fp8:
            assert name not in after  # NVFP4 scales are dropped
        else:
            assert after[name] == (dtype, shape, data), f"{name} (norm/router) changed"
    # nothing unexpected was added
    added = set(after) - set(before)
    assert all(
        n.endswith(("weight_scale", "weight_scale_inv", "_proj_scale_inv")) or "draft_lm_head" in n
        for n in added
    )
    # index exact
    index_path = dst / "model.safetensors.index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
        indexed = {k: v for k, v in after.items() if "draft_lm_head" not in k}  # head: own file
        assert set(index["weight_map"]) == set(indexed)
        assert index["metadata"]["total_size"] == sum(len(v[2]) for v in indexed.values())
    assert bad_files(dst, manifest) == []


def test_nvfp4_vlm_moe_variant(nvfp4_vlm_moe: Path, tmp_path: Path) -> None:
    src = nvfp4_vlm_moe
    digest = tree_digest(src)
    dst = tmp_path / "out-mtpfp8"
    report = quantize_mtp(str(src), dst, device="cpu", fp8_from_4bit=True)
    assert tree_digest(src) == digest, "source changed"
    _check_variant(src, dst)
    assert len(report.plan.linears) == 20 and report.max_rel_l2 < 0.05
    # untouched shards are hard links of the source's
    for shard in report.plan.linked:
        assert os.stat(dst / shard.file).st_ino == os.stat(src / shard.file).st_ino
    assert [s.file for s in report.plan.rewritten] == ["model-00003-of-00003.safetensors"]
    # configs (standard variant, DESIGN §5): MIXED_PRECISION, the drafter declared FP8,
    # every target module as the source resolved it (W4A16: no input activations declared)
    before, after = load_quant_configs(src), load_quant_configs(dst)
    decl = declared_quant(after)
    for module in read_manifest(dst).drafter.fp8_linears:  # type: ignore[union-attr]
        expected = "FP8_PB_WO" if ".experts." in module else "FP8_PER_CHANNEL_PER_TOKEN"
        assert declared_algorithm(decl, module) == expected
    assert declared_algorithm(decl, "model.language_model.layers.0.self_attn.q_proj") == "W4A16_NVFP4"
    assert after.config["quantization_config"]["quant_algo"] == "MIXED_PRECISION"
    assert "quantization" not in after.config["quantization_config"]  # vLLM's flat form
    assert after.hf_quant is not None and after.hf_quant["quantization"]["quant_algo"] == "MIXED_PRECISION"
    assert list(after.config) == list(before.config)
    for key in before.config:
        if key != "quantization_config":
            assert after.config[key] == before.config[key]
    assert after.hf_quant is not None and before.hf_quant is not None
    assert after.hf_quant["producer"] == before.hf_quant["producer"]
    assert after.config["quantization_config"]["ignore"] == after.hf_quant["quantization"]["exclude_modules"]
    # the other files came along
    assert (dst / "generation_config.json").read_bytes() == (src / "generation_config.json").read_bytes()


def test_bf16_single_file(bf16_next: Path, tmp_path: Path) -> None:
    digest = tree_digest(bf16_next)
    dst = tmp_path / "v"
    quantize_mtp(str(bf16_next), dst, device="cpu", fp8_from_4bit=True)
    assert tree_digest(bf16_next) == digest
    _check_variant(bf16_next, dst)
    # A BF16 source: a declaration that lists only the drafter's FP8 linears, in both files.
    cfg = json.loads((dst / "config.json").read_text())
    layers = cfg["quantization_config"]["quantized_layers"]
    assert set(layers) == set(read_manifest(dst).drafter.fp8_linears)  # type: ignore[union-attr]
    hf_quant = json.loads((dst / "hf_quant_config.json").read_text())
    assert hf_quant["quantization"]["quantized_layers"] == layers
    cfg.pop("quantization_config")
    assert cfg == json.loads((bf16_next / "config.json").read_text())  # nothing else changed
    assert not (dst / "model.safetensors.index.json").exists()


def test_nvfp4_drafter_dequantized_exactly(tmp_path: Path) -> None:
    src = write_checkpoint(
        tmp_path / "src", Spec(family="qwen3_next", quant="nvfp4", drafter_quant="nvfp4", exclude=["lm_head"])
    )
    dst = tmp_path / "dst"
    quantize_mtp(str(src), dst, device="cpu", fp8_from_4bit=True)
    w = dequantize_nvfp4(
        load_tensor(src, "mtp.fc.weight"),
        load_tensor(src, "mtp.fc.weight_scale"),
        load_tensor(src, "mtp.fc.weight_scale_2"),
    )
    scale = w.abs().max() / 448.0
    expected = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(load_tensor(dst, "mtp.fc.weight").view(torch.uint8), expected.view(torch.uint8))
    names = raw_tensors(dst)
    assert "mtp.fc.weight_scale_2" not in names and "mtp.fc.input_scale" not in names
    assert names["mtp.fc.weight"][1] == [64, 128]


def test_fused_experts_scale_per_expert(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5_moe", fused_experts=True))
    dst = tmp_path / "dst"
    quantize_mtp(str(src), dst, device="cpu", fp8_from_4bit=True)
    w = load_tensor(src, "mtp.layers.0.mlp.experts.gate_up_proj").float()
    scale = load_tensor(dst, "mtp.layers.0.mlp.experts.gate_up_proj_scale_inv")
    # [E, 2 * ceil(I/128), ceil(H/128)]: gate blocks then up blocks, the per-expert value replicated.
    assert scale.shape == (4, 2, 1)
    assert torch.equal(scale, (w.abs().amax(dim=(1, 2)) / 448.0).reshape(4, 1, 1).expand(4, 2, 1))
    _check_variant(src, dst)


def test_refusals(nvfp4_vlm_moe: Path, tmp_path: Path) -> None:
    dst = tmp_path / "v"
    quantize_mtp(str(nvfp4_vlm_moe), dst, device="cpu", fp8_from_4bit=True)
    with pytest.raises(OutputError, match="already exists; pass force=True to replace it"):
        quantize_mtp(str(nvfp4_vlm_moe), dst, device="cpu", fp8_from_4bit=True)
    with pytest.raises(ConversionError, match="already an -mtpfp8 variant"):
        quantize_mtp(str(dst), tmp_path / "again", device="cpu", fp8_from_4bit=True)
    with pytest.raises(OutputError, match="inside the source"):
        quantize_mtp(str(nvfp4_vlm_moe), nvfp4_vlm_moe / "sub", device="cpu", fp8_from_4bit=True)
    with pytest.raises(OutputError, match="inside the source"):
        quantize_mtp(str(nvfp4_vlm_moe), nvfp4_vlm_moe, device="cpu", fp8_from_4bit=True)
    report = quantize_mtp(str(nvfp4_vlm_moe), dst, device="cpu", force=True, fp8_from_4bit=True)
    assert report.linked == 3


def test_dry_run_writes_nothing(
    nvfp4_vlm_moe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        ["quantize-mtp", str(nvfp4_vlm_moe), str(tmp_path / "v"), "--dry-run", "--json"], capsys
    )
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert plan["rewritten_shards"] == ["model-00003-of-00003.safetensors"]
    assert len(plan["linked_shards"]) == 2 and "mtp.fc" in plan["fp8_linears"]
    assert list(tmp_path.iterdir()) == []


def test_nan_weight_names_tensor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file, save_file

    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5"))
    t = load_file(str(src / "model.safetensors"))
    t["mtp.layers.0.self_attn.o_proj.weight"][0, 0] = float("nan")
    save_file(t, str(src / "model.safetensors"))
    code, _, err = run_cli(["quantize-mtp", str(src), str(tmp_path / "v")], capsys)
    assert code == 1 and "mtp.layers.0.self_attn.o_proj.weight" in err and "NaN" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_failure_mid_write_leaves_nothing(
    nvfp4_vlm_moe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mtpconv.shard_rewrite as variant

    calls = {"n": 0}
    real = variant._quantize

    def failing(name, w, device):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        return real(name, w, device)

    monkeypatch.setattr(variant, "_quantize", failing)
    digest = tree_digest(nvfp4_vlm_moe)
    with pytest.raises(OSError):
        quantize_mtp(str(nvfp4_vlm_moe), tmp_path / "v", device="cpu", fp8_from_4bit=True)
    assert list(tmp_path.iterdir()) == []
    assert tree_digest(nvfp4_vlm_moe) == digest


def test_no_mtp_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5", write_mtp=False))
    code, _, err = run_cli(["quantize-mtp", str(src), str(tmp_path / "v")], capsys)
    assert code == 1 and "no MTP drafter" in err


def test_fix_exclusions(nvfp4_vlm_moe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    digest = tree_digest(nvfp4_vlm_moe)
    dst = tmp_path / "fixed"
    report = fix_exclusions(str(nvfp4_vlm_moe), dst)
    assert report.excluded == ["mtp.fc"]
    assert tree_digest(nvfp4_vlm_moe) == digest
    for shard in nvfp4_vlm_moe.glob("*.safetensors"):
        assert os.stat(dst / shard.name).st_ino == os.stat(shard).st_ino
    configs = load_quant_configs(dst)
    decl = declared_quant(configs)
    assert declared_algorithm(decl, "mtp.fc") is None
    assert declared_algorithm(decl, "model.language_model.layers.1.mlp.experts.0.up_proj") == "NVFP4"
    assert configs.hf_quant["quantization"]["exclude_modules"][-1] == "mtp.fc"  # type: ignore[index]
    code, out, _ = run_cli(["inspect", str(dst), "--json"], capsys)
    assert code == 0
    assert not [f for f in json.loads(out)["findings"] if f["severity"] == "error"]
    # in place, with backups
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(nvfp4_vlm_moe, copy)
    code, _, err = run_cli(["fix-exclusions", str(copy), "--in-place"], capsys)
    assert code == 0, err
    assert (copy / "config.json.bak").read_bytes() == (nvfp4_vlm_moe / "config.json").read_bytes()
    assert declared_algorithm(declared_quant(load_quant_configs(copy)), "mtp.fc") is None
    code, _, err = run_cli(["fix-exclusions", str(copy)], capsys)
    assert code == 2 and "--in-place" in err  # a usage error, found before any read
