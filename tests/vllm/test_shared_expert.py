"""The drafter's gated MLPs (the MoE shared expert) as one ``torch.ops.mtpconv.fp8_mlp`` call.

Real ``Qwen2MoeMLP`` modules (vLLM's shared expert) are built with the plugin's quant config
in a one-process gloo world, loaded through vLLM's weight loaders and prepared by
``Fp8DrafterLinearMethod.process_weights_after_loading``. The ``cuda`` kernel is chosen by
patching :func:`mtpconv.vllm_plugin.kernels.choose_kernel`: on CPU that kernel's
``fp8_linear`` and ``fp8_mlp`` take their torch paths, so the switched forward runs here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from fixtures.vllm_run import run
from mtpconv.formats.fp8 import FP8_MAX, quantize_fp8
from mtpconv.kernels import mlp as kernels_mlp
from mtpconv.vllm_plugin import kernels, shared_expert
from mtpconv.vllm_plugin.drafter import MtpconvDrafterMixin
from mtpconv.vllm_plugin.quant import DrafterQuantConfig
from tests.helpers import rel_error

PREFIX = "mtp.layers.0.mlp.shared_expert"
PACKED = {"gate_up_proj": ["gate_proj", "up_proj"]}
H, INTER = 64, 32


@pytest.fixture
def world(tmp_path: Path) -> Iterator[None]:
    """A one-process gloo world under a default ``VllmConfig`` (vLLM's layers need both)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{tmp_path / 'dist_init'}",
            backend="gloo",
        )
        try:
            initialize_model_parallel(1, 1)
            yield
        finally:
            cleanup_dist_env_and_memory()


@pytest.fixture
def cuda_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """FP8 drafter weights prepared for the ``cuda`` kernel (run here by its CPU paths)."""
    monkeypatch.setattr(kernels, "choose_kernel", lambda weight: kernels.CUDA)


def _per_row(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def _quantized(w: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if per_channel:
        return _per_row(w)
    q = quantize_fp8(w)
    return q.weight, q.scale.reshape(1)


def _build(
    *,
    fp8: bool = True,
    per_channel: bool = False,
    expert_gate: bool = False,
    reduce_results: bool = False,
    seed: int = 0,
    prepare: bool = True,
) -> Any:
    """A loaded shared expert: FP8 gate/up/down through the plugin's method (``fp8``) or
    unquantized; ``prepare``: its quant methods' ``process_weights_after_loading`` has run."""
    from vllm.model_executor.layers.linear import ReplicatedLinear
    from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP

    names = frozenset(f"{PREFIX}.{p}" for p in ("gate_proj", "up_proj", "down_proj"))
    layouts = dict.fromkeys(names, "per_channel") if per_channel else {}
    cfg = DrafterQuantConfig(None, names, PACKED, layouts) if fp8 else None
    gate = None
    if expert_gate:
        gate = ReplicatedLinear(
            H, 1, bias=False, quant_config=None, params_dtype=torch.bfloat16, prefix=f"{PREFIX}_gate"
        )
    module = Qwen2MoeMLP(
        H,
        INTER,
        "silu",
        quant_config=cfg,
        reduce_results=reduce_results,
        expert_gate=gate,
        disable_tp=True,
        prefix=PREFIX,
    )
    g = torch.Generator().manual_seed(seed)
    dense = {
        n: torch.randn(*s, generator=g) / s[1] ** 0.5
        for n, s in (("gate", (INTER, H)), ("up", (INTER, H)), ("down", (H, INTER)))
    }
    gu, dn = module.gate_up_proj, module.down_proj
    if fp8:
        for shard, name in enumerate(("gate", "up")):
            w, s = _quantized(dense[name], per_channel)
            gu.weight.weight_loader(gu.weight, w, shard)
            gu.weight_scale.weight_loader(gu.weight_scale, s, shard)
        w, s = _quantized(dense["down"], per_channel)
        dn.weight.weight_loader(dn.weight, w)
        dn.weight_scale.weight_loader(dn.weight_scale, s)
    else:
        gu.weight.data.copy_(torch.cat([dense["gate"], dense["up"]]))
        dn.weight.data.copy_(dense["down"])
    if gate is not None:
        gate.weight.data.copy_(torch.randn(1, H, generator=g) / H**0.5)
    if prepare:
        for layer in (gu, dn, *([] if gate is None else [gate])):
            layer.quant_method.process_weights_after_loading(layer)
    return module


def _switched(module: Any) -> bool:
    bound = module.__dict__.get("forward")
    return bound is not None and bound.__func__ is shared_expert.fp8_mlp_forward


def _dequantized_reference(module: Any, x: torch.Tensor) -> torch.Tensor:
    """The MLP in float64 from the prepared FP8 weights and their row scales."""
    gu, dn = module.gate_up_proj.mtpconv_fp8, module.down_proj.mtpconv_fp8
    y = x.double() @ (gu.weight.double() * gu.row_scale.double()[:, None]).T
    act = F.silu(y[..., :INTER]) * y[..., INTER:]
    return act @ (dn.weight.double() * dn.row_scale.double()[:, None]).T


@pytest.mark.usefixtures("world", "cuda_kernel")
def test_fp8_shared_expert_on_the_cuda_kernel_is_switched() -> None:
    from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP

    module = _build()
    assert module.gate_up_proj.mtpconv_fp8.kernel == kernels.CUDA
    assert shared_expert.fusable(module)
    assert shared_expert.fuse_gated_mlps(torch.nn.Sequential(module)) == (1, 1)
    assert _switched(module)
    assert (
        type(module) is Qwen2MoeMLP and Qwen2MoeMLP.__dict__["forward"] is not shared_expert.fp8_mlp_forward
    )
    assert not _switched(_build())  # another instance of the class keeps vLLM's forward
    # Again: the same forward, bound again, still one module.
    assert shared_expert.fuse_gated_mlps(module) == (1, 1) and _switched(module)


@pytest.mark.usefixtures("world", "cuda_kernel")
@pytest.mark.parametrize("reduce_results", [False, True])
def test_tp_size_one_down_proj_is_switched_whatever_it_reduces(reduce_results: bool) -> None:
    module = _build(reduce_results=reduce_results)
    assert shared_expert.fuse_gated_mlps(module) == (1, 1)


@pytest.mark.usefixtures("world", "cuda_kernel")
def test_a_down_proj_that_all_reduces_under_tp_keeps_vllms_forward() -> None:
    reducing = _build(reduce_results=True)
    reducing.down_proj.tp_size = 2  # what RowParallelLinear records on a rank of a TP-2 group
    assert shared_expert.fuse_gated_mlps(reducing) == (0, 1) and not _switched(reducing)
    partial = _build(reduce_results=False)  # the shared expert: the routed experts reduce
    partial.down_proj.tp_size = 2
    assert shared_expert.fuse_gated_mlps(partial) == (1, 1) and _switched(partial)


@pytest.mark.usefixtures("world", "cuda_kernel")
@pytest.mark.parametrize("linear", ["gate_up_proj", "down_proj"])
def test_a_bias_keeps_vllms_forward(linear: str) -> None:
    module = _build()
    out = getattr(module, linear).output_size_per_partition
    getattr(module, linear).bias = torch.nn.Parameter(torch.zeros(out), requires_grad=False)
    assert shared_expert.fuse_gated_mlps(module) == (0, 1) and not _switched(module)


@pytest.mark.usefixtures("world")
def test_other_kernels_and_bf16_keep_vllms_forward() -> None:
    cpu = _build()  # choose_kernel as it is: cpu_vnni or dequant here
    assert cpu.gate_up_proj.mtpconv_fp8.kernel in (kernels.CPU_VNNI, kernels.DEQUANT)
    bf16 = _build(fp8=False)
    assert shared_expert.fuse_gated_mlps(torch.nn.ModuleList([cpu, bf16])) == (0, 2)
    assert not _switched(cpu) and not _switched(bf16)


@pytest.mark.usefixtures("world", "cuda_kernel")
def test_one_cuda_linear_is_not_enough() -> None:
    module = _build()
    module.down_proj.mtpconv_fp8.kernel = kernels.DEQUANT
    assert shared_expert.fuse_gated_mlps(module) == (0, 1) and not _switched(module)


@pytest.mark.usefixtures("world", "cuda_kernel")
def test_another_activation_or_an_overriding_subclass_keeps_its_forward() -> None:
    from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP

    other_act = _build()
    other_act.act_fn = torch.nn.SiLU()
    assert not shared_expert.fusable(other_act)

    class Scaled(Qwen2MoeMLP):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    sub = _build()
    sub.__class__ = Scaled
    assert shared_expert.fuse_gated_mlps(torch.nn.ModuleList([other_act, sub])) == (0, 2)
    assert not _switched(other_act) and not _switched(sub)


@pytest.mark.usefixtures("world", "cuda_kernel")
def test_fused_mlp_off_keeps_vllms_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _build()
    monkeypatch.setenv(kernels_mlp.ENV, "0")
    assert not shared_expert.enabled()
    assert shared_expert.fuse_gated_mlps(module) == (0, 1) and not _switched(module)
    monkeypatch.setenv(kernels_mlp.ENV, "1")
    assert shared_expert.fuse_gated_mlps(module) == (1, 1) and _switched(module)


@pytest.mark.usefixtures("world", "cuda_kernel")
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("tokens", [1, 4, 7])
def test_switched_forward_equals_vllms(per_channel: bool, tokens: int) -> None:
    from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP

    module = _build(per_channel=per_channel, seed=tokens)
    gu, dn = module.gate_up_proj.mtpconv_fp8, module.down_proj.mtpconv_fp8
    # Per-shard scales make gate/up per row; per-channel ones make both per row.
    assert not gu.uniform and dn.uniform is not per_channel
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(100 + tokens)).to(torch.bfloat16)
    with torch.inference_mode():
        vllm_out = module(x)
        assert shared_expert.fuse_gated_mlps(module) == (1, 1)
        out = module(x)
        assert torch.equal(Qwen2MoeMLP.forward(module, x), vllm_out)  # the class is untouched
    assert out.dtype == torch.bfloat16 and out.shape == (tokens, H)
    # Same FP8 linears on both sides; only the SiLU * up step differs (torch's vs vLLM's).
    assert rel_error(out, vllm_out) < 1e-3
    # Two bf16 roundings (the activations, the output) from the float64 reference.
    assert rel_error(out, _dequantized_reference(module, x)) < 2e-2


@pytest.mark.usefixtures("world", "cuda_kernel")
def test_switched_forward_applies_the_expert_gate() -> None:
    from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP

    module = _build(expert_gate=True, seed=3)
    x = torch.randn(3, H, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    with torch.inference_mode():
        vllm_out = Qwen2MoeMLP.forward(module, x)
        assert shared_expert.fuse_gated_mlps(module) == (1, 1)
        out = module(x)
        gate = module.expert_gate
        module.expert_gate = None
        plain = module(x)
        module.expert_gate = gate
        factor = torch.sigmoid(gate(x)[0])
    assert factor.shape == (3, 1) and bool(((factor > 0.05) & (factor < 0.95)).all())
    assert rel_error(out, vllm_out) < 1e-3
    assert torch.equal(out, factor * plain)


@pytest.mark.usefixtures("world", "cuda_kernel")
def test_dynamo_sees_one_opaque_fp8_mlp_call() -> None:
    """vLLM compiles the drafter's forward: the switched MLP must trace to the one op."""
    module = _build(expert_gate=True, seed=5)
    assert shared_expert.fuse_gated_mlps(module) == (1, 1)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend, fullgraph=True, dynamic=True)
    with torch.inference_mode():
        for tokens in (2, 5, 9):  # not 1: dynamo specializes a size of 1
            x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(tokens)).to(torch.bfloat16)
            assert torch.equal(compiled(x), module(x))
    torch._dynamo.reset()
    assert len(graphs) == 1  # one graph for every token count
    # Dynamo records the op's packet (torch.ops.mtpconv.fp8_mlp), AOT tracing its overload.
    ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum(op.startswith("mtpconv.fp8_mlp") for op in ops) == 1, ops
    assert not any(op.startswith("mtpconv.fp8_linear") for op in ops), ops


def test_summary_names_the_counts_and_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert shared_expert.summary(1, 1).startswith("1 of the drafter's 1 SiLU-gated MLP(s)")
    assert "others keep vLLM's forward" not in shared_expert.summary(1, 1)
    partial = shared_expert.summary(0, 2)
    assert partial.startswith("0 of the drafter's 2") and "cuda kernel" in partial and "all-reduce" in partial
    monkeypatch.setenv(kernels_mlp.ENV, "0")
    assert shared_expert.summary(0, 1).startswith("MTPCONV_FUSED_MLP=0: the drafter's 1 SiLU-gated")


class _Drafter(MtpconvDrafterMixin, torch.nn.Module):
    """The mixin over a plain module holding ``model``: its hook without a whole drafter."""

    def __init__(self, model: torch.nn.Module, settings: object | None) -> None:
        torch.nn.Module.__init__(self)
        self.model = model
        self.mtpconv = settings  # type: ignore[assignment]


@pytest.mark.usefixtures("world", "cuda_kernel")
def test_vllms_loader_hook_switches_the_drafters_shared_expert() -> None:
    """vLLM's ``process_weights_after_loading`` runs every layer's quant method, then the
    model's own hook: the mixin's, which switches the FP8 shared expert."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    module = _build(prepare=False)
    drafter = _Drafter(torch.nn.ModuleDict({"layers": torch.nn.ModuleList([module])}), SimpleNamespace())
    config = SimpleNamespace(
        word_embeddings_untied_by_checkpoint=False, dtype=torch.bfloat16, quantization=None
    )
    process_weights_after_loading(drafter, config, torch.device("cpu"))  # type: ignore[arg-type]
    assert module.gate_up_proj.mtpconv_fp8.kernel == kernels.CUDA
    assert _switched(module)
    stock = _build()  # without mtpconv.json the drafter is vLLM's and nothing changes
    _Drafter(torch.nn.ModuleList([stock]), None).process_weights_after_loading()
    assert not _switched(stock)


def _shared_expert_forwards(worker: Any) -> dict[str, str]:
    """Which forward each of the loaded drafter's gated MLPs has (a probe for ``run``)."""
    from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP

    model = worker.model_runner.drafter.model
    return {
        name: getattr(m.forward, "__qualname__", "?")
        for name, m in model.named_modules()
        if isinstance(m, Qwen2MoeMLP)
    }


@pytest.mark.parametrize(
    ("variant", "layer"),
    [
        ("moe_fp8", "model.layers.0.mlp.shared_expert"),  # Qwen3.5-MoE
        ("next_fp8_vocab", "model.layers.0.mlp.shared_expert"),  # Qwen3-Next
        ("planted_fp8", "model.layers.0.mlp"),  # dense Qwen3.5: its MLP is the same class
    ],
)
def test_served_moe_drafter_runs_its_shared_expert_through_fp8_mlp(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, variant: str, layer: str
) -> None:
    """A whole engine on CPU with the drafter's FP8 weights on the ``cuda`` kernel (at
    tensor-parallel size 1): the gated MLP is switched, its one op runs in the drafter
    steps, and greedy output and acceptance are those of the unswitched drafter."""
    calls: list[int] = []
    three = kernels_mlp.three_launches

    def counted(*args: torch.Tensor) -> torch.Tensor:
        calls.append(int(args[0].numel() // args[0].shape[-1]))
        return three(*args)

    monkeypatch.setattr(kernels, "choose_kernel", lambda weight: kernels.CUDA)
    monkeypatch.setattr(kernels_mlp, "three_launches", counted)
    switched = run(models[variant], probe=_shared_expert_forwards)
    assert switched.extra["probe"] == {layer: shared_expert.fp8_mlp_forward.__qualname__}
    assert calls, "the switched shared expert never ran"
    calls.clear()
    plain = run(models[variant], probe=_shared_expert_forwards, env={kernels_mlp.ENV: "0"})
    assert plain.extra["probe"] == {layer: "Qwen2MoeMLP.forward"}
    assert calls == []
    assert switched.outputs == plain.outputs
    assert switched.drafted == plain.drafted > 0
    assert switched.accepted == plain.accepted


@pytest.mark.usefixtures("world")
def test_renamed_drafter_linears_resolve_through_their_checkpoint_names() -> None:
    """MiMo's way (vLLM names ``model.layers.{N}.mlp.gate_up_proj``, the manifest
    ``model.mtp_layers.0.mlp.gate_proj`` / ``up_proj``): FP8 when every part is listed, an error
    when only some are, the base config's choice for a module that is none of them."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, UnquantizedLinearMethod

    from mtpconv.errors import ManifestError
    from mtpconv.vllm_plugin.quant import Fp8DrafterLinearMethod

    vllm, ckpt = "model.layers.2.mlp", "model.mtp_layers.0.mlp"
    renamed = {f"{vllm}.{p}": f"{ckpt}.{p}" for p in ("gate_proj", "up_proj")}
    layer = MergedColumnParallelLinear(
        H, [INTER, INTER], bias=False, disable_tp=True, prefix=f"{vllm}.gate_up_proj"
    )
    both = DrafterQuantConfig(None, frozenset(renamed.values()), PACKED, {}, renamed)
    assert isinstance(both.get_quant_method(layer, f"{vllm}.gate_up_proj"), Fp8DrafterLinearMethod)
    assert isinstance(
        both.get_quant_method(layer, "model.layers.1.mlp.gate_up_proj"), UnquantizedLinearMethod
    )
    only_gate = {f"{vllm}.gate_proj": f"{ckpt}.gate_proj"}
    partial = DrafterQuantConfig(None, frozenset(only_gate.values()), PACKED, {}, only_gate)
    with pytest.raises(ManifestError, match="lists only some of"):
        partial.get_quant_method(layer, f"{vllm}.gate_up_proj")
