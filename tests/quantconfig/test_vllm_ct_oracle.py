"""A compressed-tensors variant read by vLLM's own CompressedTensorsConfig (needs vLLM).

For a CT NVFP4 Qwen3.5-MoE source and its -mtpfp8 variant, vLLM's scheme resolution
(``get_scheme_dict`` with the model's mapper and packed-module mapping; routed experts
through their expert-0 projections, as ``CompressedTensorsMoEMethod`` looks them up) must
give every target layer exactly the source's scheme, and every drafter linear the FP8
channel / dynamic-token group. NVFP4 layers are compared by scheme dict only: their
scheme builds its kernel on construction, which raises on CPU. The dense drafter linears
are also built as vLLM ``ReplicatedLinear`` layers, loaded with the variant's stored
``weight`` / ``weight_scale [out, 1]`` and run. Routed FP8 experts need AMX or a GPU to
run here, so for them this config-level check is the proof, and fused 3-D FP8 experts (issue
47) are loaded through vLLM's own routed-experts loader into the layer its CT MoE method built
(``w13_weight`` / ``w2_weight`` FP8 and their ``[E, out, 1]`` scales, byte for byte).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.layouts import linear_modules
from mtpconv.quantconfig.match import vllm_view
from mtpconv.testing.checkpoints import Spec, write_checkpoint
from mtpconv.testing.vllm_stub import run_with_vllm

_ORACLE = r"""
import json, socket, sys, types
import torch
from safetensors import safe_open
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsConfig)
from vllm.model_executor.models.qwen3_5 import Qwen3_5MoeForCausalLM as M

def build(qc):
    cfg = CompressedTensorsConfig.from_config(json.loads(json.dumps(qc)))
    cfg.apply_vllm_mapper(M.hf_to_vllm_mapper.get_rename_mapper())
    cfg.packed_modules_mapping = M.packed_modules_mapping
    return cfg

def schemes(cfg, layer):
    experts = layer.endswith(".experts")
    stub = type("RoutedExperts" if experts else "ColumnParallelLinear", (torch.nn.Module,), {})()
    if experts:
        cfg._add_fused_moe_to_target_scheme_map()
        names = [f"{layer}.0.{p}_proj" for p in ("gate", "up", "down")]
    else:
        names = [layer]
    out = []
    for n in names:
        d = cfg.get_scheme_dict(stub, n)
        out.append(None if d is None else {
            k: (v.model_dump(mode="json") if hasattr(v, "model_dump") else v) for k, v in d.items()})
    return out

job = json.load(sys.stdin)
vc = VllmConfig()
object.__setattr__(vc, "model_config", types.SimpleNamespace(dtype=torch.bfloat16, is_moe=False))
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
result = []
with set_current_vllm_config(vc):
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    initialize_model_parallel(1, 1)
    for case in job:
        src, var = build(case["source"]), build(case["variant"])
        res = {"kv": [src.kv_cache_scheme, var.kv_cache_scheme], "target": {}, "drafter": {}, "run": {}}
        for layer in case["target"]:
            res["target"][layer] = [schemes(src, layer), schemes(var, layer)]
        for layer in case["drafter"]:
            res["drafter"][layer] = schemes(var, layer)
        tensors = {}
        for f in case["files"]:
            with safe_open(f, "pt") as h:
                tensors.update({k: h.get_tensor(k) for k in h.keys()})
        for module in case["dense"]:
            w, s = tensors[module + ".weight"], tensors[module + ".weight_scale"]
            lin = ReplicatedLinear(w.shape[1], w.shape[0], bias=False, quant_config=var,
                                   prefix=module, params_dtype=torch.bfloat16)
            lin.weight_loader(lin.weight, w)
            lin.weight_loader(lin.weight_scale, s)
            lin.quant_method.process_weights_after_loading(lin)
            x = torch.randn(3, w.shape[1], generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
            y = lin(x)[0].float()
            ref = x.float() @ (w.float() * s).T
            res["run"][module] = {
                "scheme": type(lin.scheme).__name__, "strategy": str(lin.scheme.weight_quant.strategy),
                "kernel": type(lin.scheme.fp8_linear).__name__,
                "scale_shape": list(s.shape),
                "rel_err": float((y - ref).norm() / ref.norm())}
        res["experts"] = {}
        for layer_name in case["fused_experts"]:
            # vLLM's own routed-experts loader, fed the variant's fused tensors by their names
            # relative to the layer (as AutoWeightsLoader hands them down)
            mine = {k[len(layer_name) + 1:]: v for k, v in tensors.items() if k.startswith(layer_name + ".")}
            n_exp, two_i, hidden = mine["gate_up_proj"].shape
            moe = FusedMoEFactory(num_experts=n_exp, top_k=1, hidden_size=hidden,
                                  intermediate_size=two_i // 2, quant_config=var, prefix=layer_name,
                                  params_dtype=torch.bfloat16)
            routed = next(m for m in moe.modules() if type(m).__name__ == "RoutedExperts")
            params = dict(routed.named_parameters())
            for p in params.values():
                p.data.zero_()
            loaded = sorted(set(moe.load_weights(list(mine.items()))))
            same = {
                "w13_weight": torch.equal(params["w13_weight"].view(torch.uint8), mine["gate_up_proj"].view(torch.uint8)),
                "w2_weight": torch.equal(params["w2_weight"].view(torch.uint8), mine["down_proj"].view(torch.uint8)),
                "w13_weight_scale": torch.equal(params["w13_weight_scale"], mine["gate_up_proj_scale"]),
                "w2_weight_scale": torch.equal(params["w2_weight_scale"], mine["down_proj_scale"]),
            }
            res["experts"][layer_name] = {
                "method": type(routed.quant_method).__name__, "loaded": loaded, "same": same,
                "dtypes": {k: str(v.dtype) for k, v in params.items()}}
        result.append(res)
json.dump(result, sys.stdout)
"""

FP8_WEIGHTS = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}


def _case(root: Path, name: str, spec: Spec) -> dict[str, Any]:
    src = write_checkpoint(root / f"{name}-src", spec)
    out = root / f"{name}-out"
    report = quantize_mtp(str(src), out, device="cpu", fp8_from_4bit=True)
    fp8 = {lin.module for lin in report.plan.linears}
    modules = linear_modules(load_checkpoint_files(src).tensors)
    target = sorted({vllm_view(m)[1] for m in modules if m not in fp8})
    drafter = sorted({vllm_view(m)[1] for m in fp8})
    return {
        "source": json.loads((src / "config.json").read_text())["quantization_config"],
        "variant": json.loads((out / "config.json").read_text())["quantization_config"],
        "target": target,
        "drafter": drafter,
        "dense": sorted(m for m in fp8 if ".experts." not in m),
        "fused_experts": sorted({m.rsplit(".", 1)[0] for m in fp8 if m.endswith(".experts.gate_up_proj")}),
        "files": [str(p) for p in sorted(out.glob("*.safetensors"))],
    }


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_reads_the_ct_variant_drafter_as_fp8_and_the_target_as_before(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    cases = [
        _case(
            tmp_path, "nvfp4-drafter", Spec(family="qwen3_5_moe", quant="ct_nvfp4", drafter_quant="ct_nvfp4")
        ),
        _case(tmp_path, "bf16-drafter", Spec(family="qwen3_5_moe", quant="ct_nvfp4", shards=2)),
        # llm-compressor's Qwen3.5 NVFP4 example (issue 47): mtp.* copied as stored, fused 3-D
        # experts, re:^mtp.* ignored; a VLM with GDN layers and its vision tower quantized
        _case(
            tmp_path,
            "fused-drafter",
            Spec(
                family="qwen3_5_moe", quant="ct_nvfp4", fused_experts="drafter", vlm=True, gdn_and_vision=True
            ),
        ),
    ]
    answers = run_with_vllm(_ORACLE, cases, timeout=400)
    for case, res in zip(cases, answers, strict=True):
        assert res["kv"][0] == res["kv"][1]
        assert any(s is not None for pair in res["target"].values() for s in pair[0])  # NVFP4 target layers
        for layer, (before, after) in res["target"].items():
            assert before == after, layer
        assert "mtp.fc" in res["drafter"] and "mtp.layers.0.mlp.experts" in res["drafter"]
        assert "mtp.layers.0.self_attn.qkv_proj" in res["drafter"]
        for layer, found in res["drafter"].items():
            for scheme in found:
                assert scheme is not None, layer
                assert scheme["format"] == "float-quantized"
                assert {k: scheme["weights"][k] for k in FP8_WEIGHTS} == FP8_WEIGHTS, layer
                inputs = scheme["input_activations"]
                assert (inputs["num_bits"], inputs["type"], inputs["strategy"], inputs["dynamic"]) == (
                    8,
                    "float",
                    "token",
                    True,
                )
        assert set(res["experts"]) == set(case["fused_experts"])
        for layer, loaded in res["experts"].items():
            assert loaded["method"] == "CompressedTensorsW8A8Fp8MoEMethod", layer
            assert loaded["loaded"] == [f"routed_experts.{p}" for p in sorted(loaded["same"])], layer
            assert all(loaded["same"].values()), (layer, loaded["same"])
            assert loaded["dtypes"]["w13_weight"] == loaded["dtypes"]["w2_weight"] == "torch.float8_e4m3fn"
        assert set(res["run"]) == set(case["dense"])
        for module, run in res["run"].items():
            assert run["scheme"] == "CompressedTensorsW8A8Fp8" and run["strategy"] == "channel", module
            assert run["scale_shape"][1] == 1
            assert run["rel_err"] < 0.08, (module, run)  # dynamic per-token FP8 activations
