"""The MLA KV-cache trap, checked against vLLM's own objects (needs vLLM).

vLLM 0.32's ``ModelOptMixedPrecisionConfig.get_quant_method`` gives a KV-cache method
only to ``Attention`` layers, not to ``MLAAttention`` (``ModelOptNvFp4Config`` /
``ModelOptFp8Config`` handle both). So for an MLA target with an FP8 KV cache a
MIXED_PRECISION declaration would drop the calibrated k/v scales silently, and
quantize-mtp keeps the exclusion-style declaration there.

The oracle builds vLLM's config classes from the configs (config.json's
``quantization_config``, the dict vLLM reads) and runs vLLM's own KV-cache set-up,
``attention._init_kv_cache_quant``, on real ``MLAAttention`` and ``Attention`` objects
(made with ``__new__`` + ``nn.Module.__init__``: their full constructors pick an attention
backend, which is not what is tested). It reports, per attention layer, the KV-cache
method class and whether ``k_scale`` became a loadable parameter.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from fixtures.vllm_stub import run_with_vllm
from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.layouts import detect_layout
from mtpconv.quantconfig.documents import QuantConfigs, load_quant_configs
from mtpconv.quantconfig.standard import DeclarationStyle, declare_drafter

_ORACLE = r"""
import json, sys
import torch
from torch import nn
from vllm.model_executor.layers.attention.attention import Attention, _init_kv_cache_quant
from vllm.model_executor.layers.attention.mla_attention import MLAAttention
from vllm.model_executor.layers.quantization.modelopt import (
    ModelOptFp8Config, ModelOptMixedPrecisionConfig, ModelOptNvFp4Config)

CLASSES = {"modelopt_fp4": ModelOptNvFp4Config, "modelopt": ModelOptFp8Config,
           "modelopt_mixed": ModelOptMixedPrecisionConfig}

def config_of(qc):
    # vLLM's own choice of class: the first override that claims the dict.
    for name, cls in CLASSES.items():
        if cls.override_quantization_method(qc, None) == name:
            return name, cls.from_config(qc)
    raise SystemExit(f"no ModelOpt class claims {qc}")

def kv(cls, cfg, prefix):
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    layer.kv_cache_dtype = "fp8"
    _init_kv_cache_quant(layer, cfg, prefix)
    method = getattr(layer, "quant_method", None)
    return [None if method is None else type(method).__name__,
            isinstance(getattr(layer, "k_scale", None), nn.Parameter)]

out = {}
for label, qc, prefixes in json.load(sys.stdin):
    name, cfg = config_of(qc)
    out[label] = {"class": name, "layers": {p: {"MLAAttention": kv(MLAAttention, cfg, p),
                                               "Attention": kv(Attention, cfg, p)}
                                           for p in prefixes}}
json.dump(out, sys.stdout)
"""


def _quant_config(directory: Path) -> dict[str, Any]:
    qc: dict[str, Any] = json.loads((directory / "config.json").read_text())["quantization_config"]
    return qc


def _mixed_declaration(src: Path) -> dict[str, Any]:
    """What quantize-mtp would declare if the target were not MLA (the MIXED form)."""
    configs = load_quant_configs(src)
    not_mla = copy.deepcopy(configs.config)
    del not_mla["kv_lora_rank"]
    files = load_checkpoint_files(src)
    layout = detect_layout(not_mla, files.tensors)
    rewritten, decl = declare_drafter(
        QuantConfigs(not_mla, configs.hf_quant), files.tensors, layout, fp8_linears=layout.linears
    )
    assert decl.style is DeclarationStyle.STANDARD
    qc: dict[str, Any] = rewritten.config["quantization_config"]
    return qc


@pytest.mark.vllm
def test_every_attention_layer_keeps_its_kv_cache_method(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    spec = Spec(family="deepseek_v3", quant="nvfp4", extra_config={"kv_lora_rank": 16})
    src = write_checkpoint(tmp_path / "src", spec)
    report = quantize_mtp(str(src), tmp_path / "dst", device="cpu")
    assert report.declaration is not None and report.declaration.style is DeclarationStyle.EXCLUSION
    # Every attention layer vLLM builds: the target's and the drafter's (layer N).
    prefixes = [f"model.layers.{i}.self_attn.attn" for i in range(spec.layers + spec.mtp_layers)]
    fp8 = {
        "quant_method": "modelopt",
        "quant_algo": "FP8",
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False},
        "ignore": ["lm_head"],
    }
    cases = [
        ("source", _quant_config(src), prefixes),
        ("variant", _quant_config(tmp_path / "dst"), prefixes),
        ("mixed", _mixed_declaration(src), prefixes),
        ("fp8", fp8, prefixes),
    ]
    res = run_with_vllm(_ORACLE, cases, timeout=600)
    assert res["source"]["class"] == res["variant"]["class"] == "modelopt_fp4"
    assert res["mixed"]["class"] == "modelopt_mixed" and res["fp8"]["class"] == "modelopt"
    for prefix in prefixes:
        source = res["source"]["layers"][prefix]
        # The source's FP8 KV cache: calibrated k/v scales are loadable on MLA layers.
        assert source["MLAAttention"] == ["ModelOptKVCacheMethod", True], prefix
        # The variant (exclusion style) keeps exactly that on every layer, drafter included.
        assert res["variant"]["layers"][prefix] == source, prefix
        # ModelOptFp8Config handles MLAAttention too (same base-class dispatch).
        assert res["fp8"]["layers"][prefix]["MLAAttention"] == ["ModelOptKVCacheMethod", True]
        # The trap: the MIXED declaration keeps the KV method for Attention only.
        mixed = res["mixed"]["layers"][prefix]
        assert mixed["Attention"] == ["ModelOptKVCacheMethod", True], prefix
        assert mixed["MLAAttention"] == [None, False], prefix
