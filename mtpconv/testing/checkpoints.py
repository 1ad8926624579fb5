"""Tiny real checkpoints of every MTP layout (DESIGN §4), with random weights.

Each factory writes a genuine Hugging Face checkpoint directory: config.json,
safetensors shards (+ index when sharded) and, for NVFP4, a ModelOpt
hf_quant_config.json mirrored in config.json, or (``quant="ct_nvfp4"``) an llm-compressor
compressed-tensors ``nvfp4-pack-quantized`` config.json. Values are seeded random.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from mtpconv.formats.nvfp4 import pack_e2m1_codes
from mtpconv.testing.layers import Fill, LayerDims, decoder_layer

FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4exp", "deepseek_v3", "glm4_moe", "mimo")


@dataclass
class Spec:
    family: str = "qwen3_5_moe"
    hidden: int = 64
    intermediate: int = 128
    vocab: int = 256
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 32
    layers: int = 2
    mtp_layers: int = 1
    experts: int = 4
    experts_per_tok: int = 2
    # fused 3-D experts: everywhere (True), or only in the drafter ("drafter": what llm-compressor
    # leaves a Qwen3.5-MoE export, its target experts quantized per expert, mtp.* copied as stored)
    fused_experts: bool | str = False
    # the Qwen3.5 modules vLLM builds without a quant method: a GDN (linear attention) layer 0 with
    # its conv1d, and (VLM) the vision tower's 5-D patch embedding and position embedding
    gdn_and_vision: bool = False
    vlm: bool = False  # model.language_model.* names + text_config
    # target linears: "bf16" | "nvfp4" | "ct_nvfp4", or (drafter tests) another of `ENCODERS`
    quant: str = "bf16"
    drafter_quant: str = "bf16"  # the drafter linears, as ``quant``
    # NVFP4 exclude_modules; default: NVIDIA's (mtp.fc gap). compressed-tensors ``ignore``;
    # default: llm-compressor's (head, routers, and ``re:^mtp.*`` when the drafter is BF16)
    exclude: list[str] | None = None
    shards: int = 1
    tie_word_embeddings: bool = False
    quant_head: bool = False  # store lm_head in NVFP4 too (with quant="nvfp4")
    declare_mtp: bool = True  # write mtp_num_hidden_layers / num_nextn_predict_layers
    write_mtp: bool = True  # write the MTP tensors
    seed: int = 0
    max_context: int | None = 262144  # max_position_embeddings, as every real Qwen3.5 config has it
    extra_config: dict[str, Any] = field(default_factory=dict)

    @property
    def is_moe(self) -> bool:
        return self.family in ("qwen3_5_moe", "qwen3_next", "deepseek_v3", "glm4_moe")


def _rand(g: torch.Generator, *shape: int, scale: float = 0.05) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


_NORMS = frozenset({"input_layernorm", "post_attention_layernorm", "q_norm", "k_norm"})


def _random_fill(g: torch.Generator) -> Fill:
    def fill(leaf: str, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.ones(*shape, dtype=torch.bfloat16) if leaf in _NORMS else _rand(g, *shape)

    return fill


def _layer(p: str, s: Spec, g: torch.Generator, *, moe: bool) -> dict[str, torch.Tensor]:
    qwen = s.family.startswith(("qwen3_5", "qwen3_next", "qwen4exp"))
    dims = LayerDims(
        hidden=s.hidden,
        heads=s.heads,
        kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        intermediate=s.intermediate,
        experts=s.experts if moe else 0,
        expert_intermediate=s.intermediate,
        shared_intermediate=s.intermediate,
        gated_q=qwen,
        shared_name="shared_expert" if qwen else "shared_experts",
        fused_experts=s.fused_experts is True or (s.fused_experts == "drafter" and p.startswith("mtp.")),
    )
    layer = decoder_layer(p, dims, _random_fill(g))
    if s.family == "mimo":
        # MiMo's layers are Qwen2's (what vLLM's mimo.py / mimo_mtp.py load): q/k/v biases,
        # no q/k norms.
        layer = {k: v for k, v in layer.items() if not k.endswith(("q_norm.weight", "k_norm.weight"))}
        for proj, heads in (("q_proj", s.heads), ("k_proj", s.kv_heads), ("v_proj", s.kv_heads)):
            layer[f"{p}self_attn.{proj}.bias"] = _rand(g, heads * s.head_dim)
    return layer


def _norm(s: Spec) -> torch.Tensor:
    return torch.ones(s.hidden, dtype=torch.bfloat16)


def build_tensors(s: Spec) -> tuple[dict[str, torch.Tensor], list[str]]:
    """All tensors of the checkpoint (BF16) and the names that form the drafter."""
    g = torch.Generator().manual_seed(s.seed)
    base = "model.language_model." if s.vlm else "model."
    t: dict[str, torch.Tensor] = {f"{base}embed_tokens.weight": _rand(g, s.vocab, s.hidden, scale=1)}
    for i in range(s.layers):
        t.update(_layer(f"{base}layers.{i}.", s, g, moe=s.is_moe))
    t[f"{base}norm.weight"] = _norm(s)
    if not s.tie_word_embeddings:
        t["lm_head.weight"] = _rand(g, s.vocab, s.hidden, scale=1)
    if s.vlm:
        t["model.visual.blocks.0.attn.qkv.weight"] = _rand(g, 3 * s.hidden, s.hidden)
        t["model.visual.blocks.0.attn.proj.weight"] = _rand(g, s.hidden, s.hidden)
    if s.gdn_and_vision:
        t.update(_gdn_and_vision(s, g, base))
    drafter: dict[str, torch.Tensor] = {}
    if s.write_mtp:
        drafter = _drafter_tensors(s, g)
    t.update(drafter)
    return t, list(drafter)


def _gdn_and_vision(s: Spec, g: torch.Generator, base: str) -> dict[str, torch.Tensor]:
    """Qwen3.5's GDN layer 0 (Gated DeltaNet: in_proj_qkv / z / b / a and out_proj linears, a
    3-D conv1d, per-head A_log / dt_bias) and, for a VLM, the vision tower's 5-D patch embedding,
    its position embedding and merger linears, with Qwen3.5's names and ranks."""
    h, heads, kdim = s.hidden, s.heads, s.head_dim
    p = f"{base}layers.0.linear_attn."
    conv = 2 * heads * kdim + heads * kdim  # q, k and v channels
    t = {
        f"{p}in_proj_qkv.weight": _rand(g, conv, h),
        f"{p}in_proj_z.weight": _rand(g, heads * kdim, h),
        f"{p}in_proj_b.weight": _rand(g, heads, h),
        f"{p}in_proj_a.weight": _rand(g, heads, h),
        f"{p}conv1d.weight": _rand(g, conv, 1, 4),
        f"{p}A_log": _rand(g, heads),
        f"{p}dt_bias": torch.ones(heads, dtype=torch.bfloat16),
        f"{p}norm.weight": torch.ones(kdim, dtype=torch.bfloat16),
        f"{p}out_proj.weight": _rand(g, h, heads * kdim),
    }
    if s.vlm:
        v = "model.visual."
        t[f"{v}patch_embed.proj.weight"] = _rand(g, h, 3, 2, 16, 16)
        t[f"{v}patch_embed.proj.bias"] = _rand(g, h)
        t[f"{v}pos_embed.weight"] = _rand(g, 64, h)
        t[f"{v}merger.linear_fc1.weight"] = _rand(g, 4 * h, 4 * h)
        t[f"{v}merger.linear_fc2.weight"] = _rand(g, h, 4 * h)
    return t


def _drafter_tensors(s: Spec, g: torch.Generator) -> dict[str, torch.Tensor]:
    d: dict[str, torch.Tensor] = {}
    h = s.hidden
    if s.family in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):
        d["mtp.fc.weight"] = _rand(g, h, 2 * h)
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            d[f"mtp.{n}.weight"] = _norm(s)
        for i in range(s.mtp_layers):
            d.update(_layer(f"mtp.layers.{i}.", s, g, moe=s.is_moe))
    elif s.family == "qwen4exp":
        d["mtp.fc_embedding.weight"] = _rand(g, h, h)
        d["mtp.fc_hidden.weight"] = _rand(g, h, h)
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            d[f"mtp.{n}.weight"] = _norm(s)
        for i in range(s.mtp_layers):
            d.update(_layer(f"mtp.layers.{i}.", s, g, moe=False))
        d["mtp.shared_head.head.weight"] = _rand(g, s.vocab, h, scale=1)
    elif s.family in ("deepseek_v3", "glm4_moe"):
        for i in range(s.mtp_layers):
            p = f"model.layers.{s.layers + i}."
            d[f"{p}eh_proj.weight"] = _rand(g, h, 2 * h)
            d[f"{p}enorm.weight"] = _norm(s)
            d[f"{p}hnorm.weight"] = _norm(s)
            d[f"{p}shared_head.norm.weight"] = _norm(s)
            d[f"{p}shared_head.head.weight"] = _rand(g, s.vocab, h, scale=1)
            d[f"{p}embed_tokens.weight"] = _rand(g, s.vocab, h, scale=1)
            d.update(_layer(p, s, g, moe=True))
    elif s.family == "mimo":
        for i in range(s.mtp_layers):
            p = f"model.mtp_layers.{i}."
            d[f"{p}input_proj.weight"] = _rand(g, h, 2 * h)
            for n in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
                d[f"{p}{n}.weight"] = _norm(s)
            d.update(_layer(p, s, g, moe=False))
    else:
        raise ValueError(f"unknown family {s.family}")
    return d


def to_nvfp4(w: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
    """A random but valid ModelOpt NVFP4 encoding with the shape of ``w``."""
    out_f, in_f = w.shape
    codes = torch.randint(0, 16, (out_f, in_f), generator=g, dtype=torch.uint8)
    scales = (torch.rand(out_f, in_f // 16, generator=g) * 2 + 0.25).to(torch.float8_e4m3fn)
    return {
        "weight": pack_e2m1_codes(codes),
        "weight_scale": scales,
        "weight_scale_2": torch.tensor(0.01, dtype=torch.float32),
        "input_scale": torch.tensor(0.5, dtype=torch.float32),
    }


def to_nvfp4_ct(w: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
    """A random but valid compressed-tensors NVFP4 encoding (llm-compressor names) of ``w``'s
    shape: the global scale is a divisor, stored ``[1]``."""
    out_f, in_f = w.shape
    codes = torch.randint(0, 16, (out_f, in_f), generator=g, dtype=torch.uint8)
    scales = (torch.rand(out_f, in_f // 16, generator=g) * 2 + 0.25).to(torch.float8_e4m3fn)
    return {
        "weight_packed": pack_e2m1_codes(codes),
        "weight_scale": scales,
        "weight_global_scale": torch.tensor([100.0], dtype=torch.float32),
        "input_global_scale": torch.tensor([2.0], dtype=torch.float32),
    }


def _rand_i32(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randint(-(2**31), 2**31 - 1, shape, generator=g, dtype=torch.int32)


def to_int_ct(
    w: torch.Tensor, g: torch.Generator, *, bits: int = 4, group: int = 32, symmetric: bool = True
) -> dict[str, torch.Tensor]:
    """compressed-tensors ``pack-quantized`` (llm-compressor's W4A16 / W8A16 schemes), random
    codes: ``32 // bits`` values packed in each int32 along the input, group scales in the
    weight's dtype, the unpacked shape as int64 and, when asymmetric, zero points packed
    along the output (``PackedQuantizationCompressor.compress``)."""
    out_f, in_f = w.shape
    pack = 32 // bits
    stored = {
        "weight_packed": _rand_i32(g, out_f, -(-in_f // pack)),
        "weight_scale": (torch.rand(out_f, in_f // group, generator=g) * 0.01).to(w.dtype),
        "weight_shape": torch.tensor([out_f, in_f], dtype=torch.int64),
    }
    if not symmetric:
        stored["weight_zero_point"] = _rand_i32(g, -(-out_f // pack), in_f // group)
    return stored


def to_mxfp4_ct(w: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
    """compressed-tensors ``mxfp4-pack-quantized``: E2M1 codes packed two a byte like NVFP4,
    one U8 E8M0 exponent (bias 127) per 32 inputs, no global scale."""
    out_f, in_f = w.shape
    codes = torch.randint(0, 16, (out_f, in_f), generator=g, dtype=torch.uint8)
    return {
        "weight_packed": pack_e2m1_codes(codes),
        "weight_scale": torch.randint(118, 127, (out_f, in_f // 32), generator=g, dtype=torch.uint8),
    }


def to_gptq(
    w: torch.Tensor, g: torch.Generator, *, bits: int = 4, group: int = 32
) -> dict[str, torch.Tensor]:
    """GPTQ (AutoGPTQ / GPTQModel) int4: ``qweight`` packed along the input ``[in * bits / 32,
    out]``, ``qzeros`` along the output ``[groups, out * bits / 32]``, F16 ``scales``
    ``[groups, out]``, ``g_idx`` ``[in]``."""
    out_f, in_f = w.shape
    pack = 32 // bits
    return {
        "qweight": _rand_i32(g, in_f // pack, out_f),
        "qzeros": _rand_i32(g, in_f // group, out_f // pack),
        "scales": (torch.rand(in_f // group, out_f, generator=g) * 0.01).to(torch.float16),
        "g_idx": torch.arange(in_f, dtype=torch.int32) // group,
    }


# Every storage a tiny checkpoint's linears can be written in besides BF16 (`Spec.quant`).
ENCODERS = {
    "nvfp4": to_nvfp4,
    "ct_nvfp4": to_nvfp4_ct,
    "ct_w4a16": to_int_ct,
    "ct_w4a16_asym": lambda w, g: to_int_ct(w, g, symmetric=False),
    "ct_w8a16": lambda w, g: to_int_ct(w, g, bits=8),
    "ct_mxfp4": to_mxfp4_ct,
    "gptq": to_gptq,
}
# compressed-tensors ``config_groups`` weights of each mode other than NVFP4 (weights only)
_CT_WEIGHTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ct_w4a16": ("pack-quantized", {"num_bits": 4, "type": "int", "symmetric": True}),
    "ct_w4a16_asym": ("pack-quantized", {"num_bits": 4, "type": "int", "symmetric": False}),
    "ct_w8a16": ("pack-quantized", {"num_bits": 8, "type": "int", "symmetric": True}),
    "ct_mxfp4": ("mxfp4-pack-quantized", {"num_bits": 4, "type": "float", "symmetric": True}),
}
CT_MODES = frozenset({"ct_nvfp4", *_CT_WEIGHTS})


# Qwen3.5's GDN and vision linears whose names do not end in _proj (vLLM builds them quantized).
_GDN_VISION_LINEARS = tuple(
    f".{leaf}.weight"
    for leaf in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
    + ("qkv", "attn.proj", "linear_fc1", "linear_fc2")
)


def _quantizable(name: str, w: torch.Tensor, s: Spec) -> bool:
    """Whether the producer quantizes this weight: 2-D linears, the vision tower's only in a
    `Spec.gdn_and_vision` checkpoint (whose configs then do not skip the tower)."""
    if not name.endswith(("_proj.weight", ".fc.weight", *_GDN_VISION_LINEARS)):
        return False
    return w.dim() == 2 and ("visual" not in name or s.gdn_and_vision)


def nvidia_exclude(s: Spec) -> list[str]:
    """What NVIDIA's Qwen3.5/Qwen3-Next NVFP4 exports exclude: the MTP layers, not mtp.fc."""
    visual = [] if s.gdn_and_vision else ["model.visual*"]
    return ["lm_head", *visual, *[f"mtp.layers.{i}*" for i in range(s.mtp_layers)]]


def quant_configs(s: Spec) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hf_quant_config.json, config.json quantization_config) for an NVFP4 checkpoint."""
    exclude = s.exclude if s.exclude is not None else nvidia_exclude(s)
    hf_quant = {
        "producer": {"name": "modelopt", "version": "0.37.0"},
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": "FP8",
            "group_size": 16,
            "exclude_modules": list(exclude),
        },
    }
    qc = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False},
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16}}
        },
        "ignore": list(exclude),
        "producer": {"name": "modelopt", "version": "0.37.0"},
    }
    return hf_quant, qc


def ct_ignore(s: Spec) -> list[str]:
    """What llm-compressor's NVFP4 recipes for Qwen MoE ignore: the head, the routers, the
    vision tower and, when it was not quantized, the MTP drafter."""
    ignore = ["lm_head", "re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$"]
    if s.vlm and not s.gdn_and_vision:
        ignore.append("re:.*visual.*")
    if s.drafter_quant not in CT_MODES:
        ignore.append("re:^mtp.*")
    return ignore


def ct_quant_config(s: Spec) -> dict[str, Any]:
    """config.json ``quantization_config`` of an llm-compressor export: NVFP4 (W4A4), or the
    weights-only scheme of ``s.drafter_quant`` (W4A16, W8A16, MXFP4; group size 32)."""
    fp4: dict[str, Any] = {
        "num_bits": 4,
        "type": "float",
        "strategy": "tensor_group",
        "group_size": 16,
        "symmetric": True,
    }
    fmt, weights = "nvfp4-pack-quantized", fp4
    inputs: dict[str, Any] | None = {**fp4, "dynamic": "local", "observer": "minmax"}
    mode = next((m for m in (s.drafter_quant, s.quant) if m in _CT_WEIGHTS), None)
    if mode is not None:
        fmt, scheme = _CT_WEIGHTS[mode]
        inputs, weights = None, {**scheme, "strategy": "group", "group_size": 32}
    return {
        "config_groups": {
            "group_0": {
                "format": fmt,
                "input_activations": inputs,
                "output_activations": None,
                "targets": ["Linear"],
                "weights": {**weights, "dynamic": False, "observer": "minmax"},
            }
        },
        "format": fmt,
        "global_compression_ratio": None,
        "ignore": list(s.exclude) if s.exclude is not None else ct_ignore(s),
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": "0.12.2",
    }


def make_config(s: Spec) -> dict[str, Any]:
    text: dict[str, Any] = {
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "vocab_size": s.vocab,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": s.tie_word_embeddings,
    }
    if s.max_context is not None:
        text["max_position_embeddings"] = s.max_context
    if s.is_moe:
        text.update(
            num_experts=s.experts, num_experts_per_tok=s.experts_per_tok, moe_intermediate_size=s.intermediate
        )
    key = {
        "qwen3_next": "num_nextn_predict_layers",
        "deepseek_v3": "num_nextn_predict_layers",
        "glm4_moe": "num_nextn_predict_layers",
        "mimo": "num_nextn_predict_layers",
    }.get(s.family, "mtp_num_hidden_layers")
    if s.declare_mtp:
        text[key] = s.mtp_layers
    if s.family == "qwen4exp":
        text["hc_count"] = 4
    arch = {
        "qwen3_5": "Qwen3_5ForCausalLM",
        "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
        "qwen3_next": "Qwen3NextForCausalLM",
        "qwen4exp": "Qwen4ExpForCausalLM",
        "deepseek_v3": "DeepseekV3ForCausalLM",
        "glm4_moe": "Glm4MoeForCausalLM",
        "mimo": "MiMoForCausalLM",
    }[s.family]
    model_type = s.family
    if s.vlm:
        text["model_type"] = f"{s.family}_text"
        cfg: dict[str, Any] = {
            "architectures": [arch.replace("ForCausalLM", "ForConditionalGeneration")],
            "model_type": model_type,
            "text_config": text,
            "vision_config": {"depth": 1},
        }
    else:
        cfg = {"architectures": [arch], "model_type": model_type, **text}
    cfg["torch_dtype"] = "bfloat16"
    cfg.update(s.extra_config)
    return cfg


def write_checkpoint(directory: str | Path, spec: Spec | None = None, **kw: Any) -> Path:
    """Write a tiny checkpoint for ``spec`` (or ``Spec(**kw)``) into ``directory``."""
    s = spec or Spec(**kw)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors, drafter = build_tensors(s)
    drafter_set = set(drafter)
    g = torch.Generator().manual_seed(s.seed + 1)
    stored: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        mode = s.drafter_quant if name in drafter_set else s.quant
        head = s.quant_head and name == "lm_head.weight"
        if mode in ENCODERS and (_quantizable(name, w, s) or head):
            mod = name[: -len(".weight")]
            for k, v in ENCODERS[mode](w, g).items():
                stored[f"{mod}.{k}"] = v
        else:
            stored[name] = w
    cfg = make_config(s)
    if CT_MODES & {s.quant, s.drafter_quant}:
        cfg["quantization_config"] = ct_quant_config(s)
    elif "gptq" in (s.quant, s.drafter_quant):  # AutoGPTQ's config.json entry
        cfg["quantization_config"] = {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": 32,
            "desc_act": False,
            "sym": True,
        }
    elif "nvfp4" in (s.quant, s.drafter_quant):
        hf_quant, qc = quant_configs(s)
        cfg["quantization_config"] = qc
        (directory / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=2) + "\n")
    (directory / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}) + "\n")
    _write_shards(directory, stored, set(k for k in stored if _is_drafter(k, drafter_set)), s.shards)
    return directory


def _is_drafter(name: str, drafter: set[str]) -> bool:
    if name in drafter:
        return True
    mod = name.rsplit(".", 1)[0]
    return f"{mod}.weight" in drafter


def _write_shards(directory: Path, stored: dict[str, torch.Tensor], drafter: set[str], shards: int) -> None:
    if shards <= 1:
        save_file(stored, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return
    # Target tensors first, drafter last: the last shard mixes both and at least
    # one shard holds no drafter tensor, as in real exports.
    names = [n for n in stored if n not in drafter] + [n for n in stored if n in drafter]
    per = math.ceil(len(names) / shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(shards):
        chunk = names[i * per : (i + 1) * per]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: stored[n] for n in chunk}, str(directory / file), metadata={"format": "pt"})
        for n in chunk:
            weight_map[n] = file
            total += stored[n].numel() * stored[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
