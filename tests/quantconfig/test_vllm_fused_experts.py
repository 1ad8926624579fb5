"""Fused 3-D routed experts in a ModelOpt NVFP4 or a BF16 source, against vLLM (issue 47).

The compressed-tensors case is in test_vllm_ct_oracle.py. Here the source is ModelOpt NVFP4
(NVIDIA-style: target NVFP4, the drafter BF16 with fused ``experts.gate_up_proj`` /
``experts.down_proj``) or plain BF16, fused everywhere. The variant declares the drafter
``MIXED_PRECISION``; vLLM 0.32's ``ModelOptMixedPrecisionConfig`` must resolve every drafter
routed-experts layer to ``FP8_PB_WO`` (``Fp8MoEMethod``, 128x128 blocks), and vLLM's own
routed-experts loader (``RoutedExperts.load_weights``: fused names, gate/up halves split on
dim 1, block scales split like the weight) must fill ``w13_weight`` / ``w2_weight`` and their
``weight_scale_inv`` from the variant's fused tensors, byte for byte, per expert.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from fixtures.vllm_stub import run_with_vllm
from mtpconv.commands.quantize_mtp import quantize_mtp

_ORACLE = r"""
import json, socket, sys, types
import torch
from safetensors import safe_open
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory
from vllm.model_executor.layers.quantization.modelopt import ModelOptMixedPrecisionConfig
from vllm.model_executor.models.qwen3_5 import Qwen3_5MoeForConditionalGeneration as M

job = json.load(sys.stdin)
vc = VllmConfig()
object.__setattr__(vc, "model_config", types.SimpleNamespace(dtype=torch.bfloat16, is_moe=True))
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
out = []
with set_current_vllm_config(vc):
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    initialize_model_parallel(1, 1)
    for case in job:
        # each case builds the same layer names: forget the previous case's layers
        vc.compilation_config.static_forward_context.clear()
        vc.compilation_config.static_all_moe_layers.clear()
        var = ModelOptMixedPrecisionConfig.from_config(case["variant"])
        var.apply_vllm_mapper(M.hf_to_vllm_mapper.get_rename_mapper())
        var.packed_modules_mapping = M.packed_modules_mapping
        tensors = {}
        for f in case["files"]:
            with safe_open(f, "pt") as h:
                tensors.update({k: h.get_tensor(k) for k in h.keys()})
        res = {}
        for layer in case["fused_experts"]:
            layer_name = layer + ".experts"
            mine = {k[len(layer_name) + 1:]: v for k, v in tensors.items() if k.startswith(layer_name + ".")}
            n_exp, two_i, hidden = mine["gate_up_proj"].shape
            moe = FusedMoEFactory(num_experts=n_exp, top_k=1, hidden_size=hidden,
                                  intermediate_size=two_i // 2, quant_config=var,
                                  prefix=layer_name, params_dtype=torch.bfloat16)
            routed = next(m for m in moe.modules() if type(m).__name__ == "RoutedExperts")
            params = dict(routed.named_parameters())
            for p in params.values():
                p.data.zero_()
            # names relative to the experts layer, as AutoWeightsLoader hands them down
            loaded = sorted({n.rpartition(".")[2] for n in moe.load_weights(list(mine.items()))})
            def same(p, t):
                a, b = params[p], mine[t]
                return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
            res[layer] = {
                "algo": var._resolve_quant_algo(layer_name),
                "method": type(routed.quant_method).__name__,
                "loaded": loaded,
                "dtypes": {k: str(v.dtype) for k, v in params.items()},
                "same": {
                    "w13_weight": same("w13_weight", "gate_up_proj"),
                    "w2_weight": same("w2_weight", "down_proj"),
                    "w13_weight_scale_inv": same("w13_weight_scale_inv", "gate_up_proj_scale_inv"),
                    "w2_weight_scale_inv": same("w2_weight_scale_inv", "down_proj_scale_inv"),
                },
            }
        out.append(res)
json.dump(out, sys.stdout)
"""

CASES = {
    # NVIDIA-style ModelOpt NVFP4 export: target NVFP4, mtp.* BF16 with fused experts
    "modelopt-nvfp4": Spec(family="qwen3_5_moe", quant="nvfp4", fused_experts="drafter", vlm=True),
    "bf16": Spec(family="qwen3_5_moe", fused_experts=True),
}


def _case(root: Path, spec: Spec) -> dict[str, Any]:
    src = write_checkpoint(root / "src", spec)
    out = root / "out"
    quantize_mtp(str(src), out, device="cpu")
    cfg = json.loads((out / "config.json").read_text())
    fp8 = json.loads((out / "mtpconv.json").read_text())["drafter"]["fp8_linears"]
    fused = sorted({m.rsplit(".", 2)[0] for m in fp8 if m.endswith(".experts.gate_up_proj")})
    return {
        "variant": cfg.get("quantization_config") or cfg["text_config"]["quantization_config"],
        "fused_experts": fused,
        "files": [str(p) for p in sorted(out.glob("*.safetensors"))],
    }


@pytest.mark.vllm
@pytest.mark.slow
def test_fused_drafter_experts_load_as_fp8_through_vllms_expert_loader(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    cases = {name: _case(tmp_path / name, spec) for name, spec in CASES.items()}
    answers = run_with_vllm(_ORACLE, list(cases.values()), timeout=600)
    for name, res in zip(cases, answers, strict=True):
        assert cases[name]["fused_experts"] and set(res) == set(cases[name]["fused_experts"]), name
        for layer, got in res.items():
            assert got["algo"] == "FP8_PB_WO" and got["method"] == "Fp8MoEMethod", (name, layer, got)
            assert got["dtypes"]["w13_weight"] == got["dtypes"]["w2_weight"] == "torch.float8_e4m3fn"
            assert {"w13_weight", "w2_weight", "w13_weight_scale_inv", "w2_weight_scale_inv"} <= set(
                got["loaded"]
            ), got["loaded"]
            assert all(got["same"].values()), (name, layer, got["same"])
