"""vLLM's own reading of a compressed-tensors variant (needs vLLM; run through `vllm_stub`).

Shared by tests/quantconfig/test_vllm_ct_oracle.py and scripts/llmcompressor_exports.py (the
same checks on exports made by llm-compressor itself). For a source and its -mtpfp8 variant,
vLLM's scheme resolution (``get_scheme_dict`` with the model's mapper and packed-module
mapping; routed experts through their expert-0 projections, as ``CompressedTensorsMoEMethod``
looks them up) must give every target layer exactly the source's scheme and every drafter
linear the FP8 channel / dynamic-token group; dense drafter linears are built as vLLM
``ReplicatedLinear`` layers, loaded and run; fused 3-D FP8 experts are loaded through vLLM's
routed-experts loader into the layer its CT MoE method builds, byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.layouts import linear_modules
from mtpconv.quantconfig.match import vllm_view
from mtpconv.testing.vllm_stub import run_with_vllm

ORACLE = r"""
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

def same_bytes(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))

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
                "w13_weight": same_bytes(params["w13_weight"], mine["gate_up_proj"]),
                "w2_weight": same_bytes(params["w2_weight"], mine["down_proj"]),
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


def oracle_case(src: Path, out: Path, fp8: Collection[str]) -> dict[str, Any]:
    """The oracle's job for source ``src`` and variant ``out`` whose FP8 drafter linears are ``fp8``."""
    modules = linear_modules(load_checkpoint_files(src).tensors)
    return {
        "source": json.loads((src / "config.json").read_text())["quantization_config"],
        "variant": json.loads((out / "config.json").read_text())["quantization_config"],
        "target": sorted({vllm_view(m)[1] for m in modules if m not in fp8}),
        "drafter": sorted({vllm_view(m)[1] for m in fp8}),
        "dense": sorted(m for m in fp8 if ".experts." not in m),
        "fused_experts": sorted({m.rsplit(".", 1)[0] for m in fp8 if m.endswith(".experts.gate_up_proj")}),
        "files": [str(p) for p in sorted(out.glob("*.safetensors"))],
    }


def ask_vllm(cases: list[dict[str, Any]], timeout: int = 400) -> list[dict[str, Any]]:
    """Run the oracle on ``cases`` in a vLLM process."""
    answers: list[dict[str, Any]] = run_with_vllm(ORACLE, cases, timeout=timeout)
    return answers


def problems(case: dict[str, Any], res: dict[str, Any]) -> list[str]:
    """Everything vLLM read differently from what the variant promises (empty: all good)."""
    out: list[str] = []
    if res["kv"][0] != res["kv"][1]:
        out.append(f"KV-cache scheme changed: {res['kv']}")
    for layer, (before, after) in res["target"].items():
        if before != after:
            out.append(f"target {layer}: {before} -> {after}")
    for layer, found in res["drafter"].items():
        for scheme in found:
            if scheme is None or scheme["format"] != "float-quantized":
                out.append(f"drafter {layer}: not FP8 ({scheme})")
                continue
            inputs = scheme["input_activations"]
            if {k: scheme["weights"][k] for k in FP8_WEIGHTS} != FP8_WEIGHTS or (
                inputs["num_bits"],
                inputs["type"],
                inputs["strategy"],
                inputs["dynamic"],
            ) != (8, "float", "token", True):
                out.append(f"drafter {layer}: {scheme}")
    if set(res["experts"]) != set(case["fused_experts"]):
        out.append(f"fused experts loaded {sorted(res['experts'])}, expected {case['fused_experts']}")
    for layer, loaded in res["experts"].items():
        want = [f"routed_experts.{p}" for p in sorted(loaded["same"])]
        if loaded["method"] != "CompressedTensorsW8A8Fp8MoEMethod" or loaded["loaded"] != want:
            out.append(f"experts {layer}: {loaded['method']} loaded {loaded['loaded']}")
        if not all(loaded["same"].values()):
            out.append(f"experts {layer}: loaded tensors differ from the stored ones: {loaded['same']}")
        if not loaded["dtypes"]["w13_weight"] == loaded["dtypes"]["w2_weight"] == "torch.float8_e4m3fn":
            out.append(f"experts {layer}: weights {loaded['dtypes']}")
    if set(res["run"]) != set(case["dense"]):
        out.append(f"dense drafter linears run {sorted(res['run'])}, expected {case['dense']}")
    for module, run in res["run"].items():
        if run["scheme"] != "CompressedTensorsW8A8Fp8" or run["strategy"] != "channel":
            out.append(f"{module}: {run['scheme']} {run['strategy']}")
        if run["scale_shape"][1] != 1 or run["rel_err"] >= 0.08:  # dynamic per-token FP8 activations
            out.append(f"{module}: {run}")
    return out
