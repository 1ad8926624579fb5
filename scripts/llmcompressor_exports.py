"""Exports made by llm-compressor itself, pushed through the checks the tests make (issue 47).

Not in CI: llm-compressor pins other transformers / compressed-tensors versions than vLLM, so
it lives in its own throwaway venv, and the checks need vLLM (the project's venv).

    python3 -m venv /tmp/lcvenv
    /tmp/lcvenv/bin/pip install "torch==2.13.0" "llmcompressor==0.14.0.1"
    PYTHONPATH=. /tmp/lcvenv/bin/python scripts/llmcompressor_exports.py make /tmp/lc-exports
    PYTHONPATH=. .venv/bin/python scripts/llmcompressor_exports.py check /tmp/lc-exports

``make`` (llm-compressor's venv) builds two tiny random sources and quantizes them as a user
following llm-compressor's own examples would:

- ``qwen35moe``: a tiny Qwen3.5-MoE VLM (GDN + full attention, a vision tower) whose MTP
  drafter is stored as Qwen's releases store it (BF16, routed experts fused 3-D), through
  ``oneshot`` with ``QuantizationModifier(scheme="NVFP4")`` (a few random calibration
  sequences; llm-compressor copies ``mtp.*`` unchanged and ignores ``re:^mtp.*``);
- ``qwen35dense``: a tiny dense Qwen3.5 through ``model_free_ptq(scheme="NVFP4A16")``, which
  quantizes the drafter's linears with the target.

``check`` (the project's venv, vLLM installed) runs on each export what the tests run on the
fixtures: inspect reports no error; the MoE export converts and vLLM's CompressedTensorsConfig
and routed-experts loader read the variant (`fixtures.ct_oracle.problems` is empty); the
NVFP4A16 drafter is refused by default and converts with ``fp8_from_4bit``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HIDDEN, HEADS, HEAD_DIM, EXPERTS, INTER, VOCAB = 64, 2, 32, 4, 128, 512
TEXT = {
    "hidden_size": HIDDEN,
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": HEADS,
    "num_key_value_heads": 1,
    "head_dim": HEAD_DIM,
    "linear_num_key_heads": HEADS,
    "linear_num_value_heads": HEADS,
    "linear_key_head_dim": HEAD_DIM,
    "linear_value_head_dim": HEAD_DIM,
    "vocab_size": VOCAB,
    "max_position_embeddings": 262144,
    "mtp_num_hidden_layers": 1,
    "tie_word_embeddings": False,
}
MOE = {
    "num_experts": EXPERTS,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": INTER,
    "shared_expert_intermediate_size": INTER,
}
VISION = {
    "depth": 1,
    "hidden_size": HIDDEN,
    "intermediate_size": 2 * HIDDEN,
    "num_heads": 2,
    "out_hidden_size": HIDDEN,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "num_position_embeddings": 64,
    "deepstack_visual_indexes": [],
}
# llm-compressor's Qwen3.5 examples' ignore list, less the vision tower and the GDN layers
# (quantized here, as the NVFP4 runs whose inspect output issue 47 quotes did)
IGNORE = ["re:.*lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$", "re:.*embed_tokens$"]


def _mtp_tensors(moe: bool):  # type: ignore[no-untyped-def]
    """A Qwen3.5 MTP block as the releases store it (experts fused 3-D when ``moe``), BF16."""
    import torch

    g = torch.Generator().manual_seed(0)

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    h, q = HIDDEN, HEADS * HEAD_DIM
    t = {"mtp.fc.weight": w(h, 2 * h)}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        t[f"mtp.{n}.weight"] = torch.ones(h, dtype=torch.bfloat16)
    p = "mtp.layers.0."
    t.update(
        {
            f"{p}input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            f"{p}post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            f"{p}self_attn.q_proj.weight": w(2 * q, h),
            f"{p}self_attn.k_proj.weight": w(HEAD_DIM, h),
            f"{p}self_attn.v_proj.weight": w(HEAD_DIM, h),
            f"{p}self_attn.o_proj.weight": w(h, q),
            f"{p}self_attn.q_norm.weight": torch.ones(HEAD_DIM, dtype=torch.bfloat16),
            f"{p}self_attn.k_norm.weight": torch.ones(HEAD_DIM, dtype=torch.bfloat16),
        }
    )
    if moe:
        t.update(
            {
                f"{p}mlp.gate.weight": w(EXPERTS, h),
                f"{p}mlp.experts.gate_up_proj": w(EXPERTS, 2 * INTER, h),
                f"{p}mlp.experts.down_proj": w(EXPERTS, h, INTER),
                f"{p}mlp.shared_expert.gate_proj.weight": w(INTER, h),
                f"{p}mlp.shared_expert.up_proj.weight": w(INTER, h),
                f"{p}mlp.shared_expert.down_proj.weight": w(h, INTER),
                f"{p}mlp.shared_expert_gate.weight": w(1, h),
            }
        )
    else:
        t.update(
            {
                f"{p}mlp.gate_proj.weight": w(INTER, h),
                f"{p}mlp.up_proj.weight": w(INTER, h),
                f"{p}mlp.down_proj.weight": w(h, INTER),
            }
        )
    return t


def _add_mtp(directory: Path, moe: bool) -> None:
    """Add the MTP block to a saved model (transformers drops ``mtp.*``) as its own shard."""
    from safetensors.torch import save_file

    tensors = _mtp_tensors(moe)
    save_file(tensors, directory / "model-mtp.safetensors", metadata={"format": "pt"})
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        doc = json.loads(index.read_text())
    else:  # one shard: write the index vLLM and llm-compressor read
        from safetensors import safe_open

        with safe_open(str(directory / "model.safetensors"), "pt") as f:
            doc = {"metadata": {}, "weight_map": dict.fromkeys(f.keys(), "model.safetensors")}
    doc["weight_map"].update(dict.fromkeys(tensors, "model-mtp.safetensors"))
    index.write_text(json.dumps(doc, indent=2))


def make(out: Path) -> None:
    import torch
    import transformers
    from datasets import Dataset

    if (out / "qwen35moe-nvfp4").exists():
        sys.exit(f"{out} already holds exports; remove it first")
    import llmcompressor
    from llmcompressor import model_free_ptq, oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import (
        AutoTokenizer,
        Qwen3_5ForCausalLM,
        Qwen3_5MoeConfig,
        Qwen3_5MoeForConditionalGeneration,
        Qwen3_5TextConfig,
    )

    from fixtures.tokenizers import write_tiny_tokenizer

    print(
        f"llmcompressor {llmcompressor.__version__}, transformers {transformers.__version__}", file=sys.stderr
    )
    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    # MoE VLM -> oneshot NVFP4 (W4A4), as llm-compressor's Qwen3.5 NVFP4 example
    src = out / "qwen35moe-bf16"
    cfg = Qwen3_5MoeConfig(text_config={**TEXT, **MOE}, vision_config=VISION)
    model = Qwen3_5MoeForConditionalGeneration(cfg).to(torch.bfloat16)
    model.save_pretrained(src)
    _add_mtp(src, moe=True)
    write_tiny_tokenizer(src, vocab_size=VOCAB)
    model = Qwen3_5MoeForConditionalGeneration.from_pretrained(src, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(src)
    calib = Dataset.from_dict({"input_ids": [[(7 * i + j) % VOCAB for j in range(16)] for i in range(4)]})
    recipe = QuantizationModifier(targets="Linear", scheme="NVFP4", ignore=IGNORE)
    oneshot(
        model=model,
        processor=tokenizer,
        dataset=calib,
        recipe=recipe,
        num_calibration_samples=4,
        max_seq_length=16,
    )
    model.save_pretrained(out / "qwen35moe-nvfp4", save_compressed=True)
    tokenizer.save_pretrained(out / "qwen35moe-nvfp4")
    # dense Qwen3.5 -> model_free_ptq NVFP4A16 (the drafter quantized with the target)
    dense = out / "qwen35dense-bf16"
    Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{**TEXT, "intermediate_size": INTER})).to(
        torch.bfloat16
    ).save_pretrained(dense)
    _add_mtp(dense, moe=False)
    # no model definition: what is not a linear weight is ignored by name
    skip = ["lm_head", "re:.*norm.*", "re:.*embed_tokens.*", "re:.*conv1d.*", "re:.*A_log", "re:.*dt_bias"]
    model_free_ptq(dense, out / "qwen35dense-nvfp4a16", scheme="NVFP4A16", ignore=skip)
    print(f"wrote {out}", file=sys.stderr)


def check(out: Path) -> int:
    import tempfile

    from fixtures.ct_oracle import ask_vllm, oracle_case, problems
    from mtpconv.commands.inspect import inspect_checkpoint
    from mtpconv.commands.quantize_mtp import quantize_mtp
    from mtpconv.errors import ConversionError
    from mtpconv.findings import Severity

    bad: list[str] = []

    def errors(path: Path) -> list[str]:
        return [f.message for f in inspect_checkpoint(str(path)).findings if f.severity is Severity.ERROR]

    work = Path(tempfile.mkdtemp(prefix="lc-check-"))
    moe = out / "qwen35moe-nvfp4"
    bad += [f"{moe.name}: {e}" for e in errors(moe)]
    report = quantize_mtp(str(moe), work / "moe-mtpfp8", device="cpu")
    fp8 = {lin.module for lin in report.plan.linears}
    print(f"{moe.name}: {len(fp8)} FP8 drafter linears, fused: {sorted(m for m in fp8 if '.experts.' in m)}")
    bad += [f"variant: {e}" for e in errors(work / "moe-mtpfp8")]
    case = oracle_case(moe, work / "moe-mtpfp8", fp8)
    (answer,) = ask_vllm([case])
    bad += [f"vLLM: {p}" for p in problems(case, answer)]
    print(f"vLLM: experts loaded {answer['experts']}")
    dense = out / "qwen35dense-nvfp4a16"
    bad += [f"{dense.name}: {e}" for e in errors(dense)]
    try:
        quantize_mtp(str(dense), work / "dense-mtpfp8", device="cpu")
        bad.append(f"{dense.name}: its 4-bit drafter was converted without being asked")
    except ConversionError as exc:
        print(f"{dense.name}: refused by default: {exc}")
    quantize_mtp(str(dense), work / "dense-mtpfp8", device="cpu", fp8_from_4bit=True)
    for line in bad:
        print("PROBLEM", line)
    print("all checks passed" if not bad else f"{len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "check"):
        sys.exit("usage: python scripts/llmcompressor_exports.py make|check OUT_DIR")
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]))
    else:
        sys.exit(check(Path(sys.argv[2])))
