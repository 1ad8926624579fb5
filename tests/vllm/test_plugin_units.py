"""Plugin pieces without serving a model: registration, FP8 kernels, manifest settings."""

from __future__ import annotations

import json
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

import mtpconv.vllm_plugin as plugin
from fixtures.vllm_run import EXPECTED_CPU_FP8_KERNEL, VLLM_CPU_HAS_FP8_KERNEL
from mtpconv.conversion_options import HeadDtype
from mtpconv.errors import ManifestError
from mtpconv.formats.fp8 import dequantize_fp8, quantize_fp8
from mtpconv.names import drafter_name
from mtpconv.vllm_plugin import kernels
from mtpconv.vllm_plugin.settings import drafter_settings
from tests.helpers import populate_hub_cache


def test_entry_point_is_declared() -> None:
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "mtpconv"]
    assert len(eps) == 1 and eps[0].load() is plugin.register


def _recording_registry(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    from vllm import ModelRegistry

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(ModelRegistry, "register_model", lambda a, c: calls.append((a, c)))
    monkeypatch.setattr(plugin, "_registered", False)
    return calls


def test_register_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _recording_registry(monkeypatch)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    plugin.register()
    plugin.register()
    assert calls == list(plugin.DRAFTER_CLASSES.items())
    assert {a for a, _ in calls} == {"Qwen3_5MTP", "Qwen3_5MoeMTP", "Qwen3NextMTP", "MiMoMTPModel"}


def test_the_plugin_replaces_the_classes_of_the_rows_it_serves() -> None:
    """`Family.draft_vocab` (the rows quantize-mtp gives a truncated head) and the classes the
    plugin registers say the same thing."""
    from mtpconv.families import FAMILIES

    served = {arch for row in FAMILIES if row.draft_vocab for arch in row.vllm_mtp}
    assert set(plugin.DRAFTER_CLASSES) == served


def test_a_scale_never_loaded_is_told_apart() -> None:
    from mtpconv.vllm_plugin.quant import UNLOADED_SCALE, has_unloaded

    assert has_unloaded(torch.tensor([0.5, UNLOADED_SCALE]))
    assert not has_unloaded(torch.tensor([0.5, 1e-30]))


@pytest.mark.parametrize("allow", ["", "other", "lora_filesystem_resolver, other"])
def test_register_respects_vllm_plugins(monkeypatch: pytest.MonkeyPatch, allow: str) -> None:
    calls = _recording_registry(monkeypatch)
    monkeypatch.setenv("VLLM_PLUGINS", allow)
    plugin.register()
    assert calls == []
    monkeypatch.setenv("VLLM_PLUGINS", "other,mtpconv")
    plugin.register()
    assert len(calls) == len(plugin.DRAFTER_CLASSES)


def test_register_without_vllm_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    plugin.register()
    assert plugin._registered is False


def _fp8(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    q = quantize_fp8(w)
    return q.weight, q.scale, torch.randn(5, k, generator=g).to(torch.bfloat16)


def _close(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """Within bf16 output rounding: relative L2 error below 1%."""
    return float((out - ref).norm() / ref.norm()) < 1e-2


def _reference(x: torch.Tensor, w: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return x.float() @ (w.float() * rows.reshape(-1, 1)).t()


needs_vllm_cpu_fp8_kernel = pytest.mark.skipif(
    not VLLM_CPU_HAS_FP8_KERNEL,
    reason="this CPU has no AVX-512: vLLM loads its AVX2 kernels, which have no FP8 weight-only kernel",
)


def test_kernel_choice_follows_the_vllm_build() -> None:
    w, s, _ = _fp8(64, 128)
    assert kernels.PreparedFp8(w, s.reshape(1).expand(64)).kernel == EXPECTED_CPU_FP8_KERNEL


@needs_vllm_cpu_fp8_kernel
def test_cpu_weight_only_kernel_matches_dequantized_reference() -> None:
    w, s, x = _fp8(64, 128)
    prepared = kernels.PreparedFp8(w, s.reshape(1).expand(64))
    assert prepared.kernel == kernels.CPU_VNNI
    assert prepared.weight.dtype == torch.float8_e4m3fn  # packed, still FP8
    ref = x.float() @ dequantize_fp8(w, s).t()
    out = prepared.apply(x)
    assert out.dtype == torch.bfloat16 and out.shape == (5, 64)
    assert _close(out.float(), ref)


def test_fused_shards_keep_their_own_scales() -> None:
    (wq, sq, x), (wk, sk, _) = _fp8(64, 128, 1), _fp8(32, 128, 2)
    w = torch.cat([wq, wk])
    rows = kernels.row_scales(torch.stack([sq * 3, sk]), [64, 32])
    available = (kernels.CPU_VNNI, kernels.DEQUANT) if VLLM_CPU_HAS_FP8_KERNEL else (kernels.DEQUANT,)
    for kernel in available:
        out = kernels.PreparedFp8(w, rows, kernel).apply(x)
        assert _close(out.float(), _reference(x, w, rows)), kernel


def test_shapes_the_cpu_kernel_cannot_take_fall_back() -> None:
    w, s, x = _fp8(40, 64)  # N not a multiple of 32: the vLLM op would abort the process
    prepared = kernels.PreparedFp8(w, s.reshape(1).expand(40))
    assert prepared.kernel == kernels.DEQUANT
    rows = s.reshape(1).expand(40)
    assert _close(prepared.apply(x).float(), _reference(x, w, rows))


def test_checkpoint_names_of_vllm_prefixes() -> None:
    from mtpconv.vllm_plugin.quant import checkpoint_names

    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    assert checkpoint_names("mtp.fc", packed) == ["mtp.fc"]
    assert checkpoint_names("model.mtp.layers.0.self_attn.qkv_proj", packed) == [
        "mtp.layers.0.self_attn.q_proj",
        "mtp.layers.0.self_attn.k_proj",
        "mtp.layers.0.self_attn.v_proj",
    ]
    assert checkpoint_names("model.layers.0.mlp.gate_up_proj", packed) == []
    assert drafter_name("model.language_model.mtp.fc") == "mtp.fc"


def test_settings_from_manifest(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert drafter_settings(str(models["planted"]), None, 512) is None
    s = drafter_settings(str(models["planted_fp8_vocab"]), None, 512)
    assert s is not None and s.head is not None
    assert s.head.dtype is HeadDtype.FP8 and s.head.ids.tolist() == list(range(384))
    assert "mtp.layers.0.self_attn.q_proj" in s.fp8_modules
    monkeypatch.setenv("MTPCONV_DRAFT_VOCAB", "0")
    off = drafter_settings(str(models["planted_fp8_vocab"]), None, 512)
    assert off is not None and off.head is None and off.fp8_modules == s.fp8_modules


def test_tampered_ids_file_is_refused(models: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    copy = Path(shutil.copytree(models["planted_fp8_vocab"], tmp_path / "v"))
    torch.save(torch.arange(0, 383, dtype=torch.int64), copy / "mtp_draft_vocab_ids.pt")
    with pytest.raises(ManifestError, match="sha256"):
        drafter_settings(str(copy), None, 512)
    doc = json.loads((copy / "mtpconv.json").read_text())
    doc["drafter"]["activation_scheme"] = "static"
    (copy / "mtpconv.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="not supported"):
        drafter_settings(str(copy), None, 512)


def test_a_draft_head_dtype_other_than_fp8_or_bf16_is_refused(
    models: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    copy = Path(shutil.copytree(models["planted_fp8_vocab"], tmp_path / "v"))
    doc = json.loads((copy / "mtpconv.json").read_text())
    doc["draft_vocab"]["head_dtype"] = "fp16"
    (copy / "mtpconv.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="draft head dtype 'fp16' is not fp8 or bf16"):
        drafter_settings(str(copy), None, 512)


def test_hub_repo_id_resolves_through_the_cache(models: dict[str, Path]) -> None:
    snapshot = populate_hub_cache("acme/tiny-mtpfp8", models["planted_fp8_vocab"])
    s = drafter_settings("acme/tiny-mtpfp8", None, 512)
    assert s is not None and s.model_dir == snapshot
    assert s.head is not None and s.head.ids.numel() == 384
    # vLLM fetched only configs and weights: no manifest in the cache means stock behaviour.
    populate_hub_cache("acme/tiny-bf16", models["planted_fp8_vocab"], ["config.json", "model.safetensors"])
    assert drafter_settings("acme/tiny-bf16", None, 512) is None
    assert drafter_settings("acme/not-cached", None, 512) is None


def test_vllms_draft_head_quantization_is_said_to_be_unused_with_a_draft_head() -> None:
    """vLLM 0.33's ``draft_lm_head_quantization`` quantizes a copy of the target's head, which a
    variant with its own draft head never reads: the plugin says so (0.32 has no such option)."""
    from types import SimpleNamespace

    from mtpconv.vllm_plugin.drafter import head_quantization_not_applied

    said = head_quantization_not_applied(SimpleNamespace(draft_lm_head_quantization="fp8"), 32768)
    assert said is not None
    assert "draft_lm_head_quantization=fp8 is not applied" in said and "32,768-row draft head" in said
    assert "MTPCONV_DRAFT_VOCAB=0" in said
    assert head_quantization_not_applied(SimpleNamespace(draft_lm_head_quantization=None), 8) is None
    assert head_quantization_not_applied(SimpleNamespace(), 8) is None  # vLLM 0.32's config


def test_the_draft_heads_top_tokens_take_vllms_step_index() -> None:
    """Model Runner V2's multi-module MTP speculator calls ``get_top_tokens(hs, spec_step_idx=i)``;
    the truncated head answers every step alike, in target-vocabulary ids."""
    from types import SimpleNamespace

    from mtpconv.vllm_plugin.drafter import DRAFT_HEAD_ATTR, MtpconvDrafterMixin

    ids = torch.tensor([7, 3, 11])
    head = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])  # 3 draft rows, hidden size 2
    processor = SimpleNamespace(get_top_tokens=lambda h, hs: (hs @ h.T).argmax(dim=-1))
    drafter = SimpleNamespace(
        draft_logits_processor=processor,
        model=SimpleNamespace(draft_vocab_ids=ids, **{DRAFT_HEAD_ATTR: head}),
    )
    hs = torch.tensor([[2.0, 1.0], [0.0, 3.0]])
    for step in (0, 1, 2):
        top = MtpconvDrafterMixin.get_top_tokens(drafter, hs, spec_step_idx=step)  # type: ignore[arg-type]
        assert top.tolist() == [7, 3]
