"""The drafter-step benchmark's own logic (benchmarks/drafter_step): variant modifiers (CPU),
and on CUDA that the step's forms compute what the serial step computes: the shared expert
on a side stream (bit for bit, eagerly and replayed from a CUDA graph), in one launch, or
inside the grouped MoE launches (within rounding)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import draft_step
from benchmarks.drafter_step import model, timing, variants
from mtpconv.kernels import pdl, triton_available, tuning


def test_variant_modifiers() -> None:
    assert variants.variant_parts("auto") == variants.Variant(path="auto")
    assert variants.variant_parts("bf16+shared") == variants.variant_parts(
        "bf16"
    )  # the default: in the grouped launches
    assert not variants.variant_parts("bf16+noshared").shared
    parts = variants.variant_parts("auto+late+side+noprep")  # +side: the shared expert's own launches
    assert parts.env == {pdl.ENV: "late"} and parts.side and parts.noprep and not parts.shared
    assert not variants.variant_parts("auto+nomlp").shared and variants.variant_parts("auto+moerows").shared
    assert not variants.variant_parts("auto+moerows+noshared").shared
    with pytest.raises(ValueError, match="need the shared expert's own launches"):
        variants.variant_parts("auto+shared+side")
    with pytest.raises(ValueError, match=r"\+shared and \+noshared"):
        variants.variant_parts("bf16+noshared+shared")
    assert variants.variant_parts("bf16+nopdl").env == {pdl.ENV: "0"}
    with pytest.raises(ValueError, match="unknown variant modifier"):
        variants.variant_parts("auto+sideways")
    assert variants.variant_parts("auto+nomlp").nomlp and not variants.variant_parts("auto").nomlp
    assert variants.variant_parts("auto+moerows").moe_rows and not variants.variant_parts("auto").moe_rows
    assert variants.variant_parts("auto+ownroute").own_route and not variants.variant_parts("bf16").own_route
    assert variants.variant_parts("auto+late+FUSED_MLP=0").env == {pdl.ENV: "late", "MTPCONV_FUSED_MLP": "0"}
    assert variants.mlp_fn("auto") is not None
    assert (
        variants.mlp_fn("auto+nomlp") is None
        and variants.mlp_fn("bf16") is None
        and variants.mlp_fn("wo_skinny") is None
    )


@pytest.mark.parametrize("variant", ["auto+shared+side", "bf16+sideways", "no_such_path"])
def test_bad_variants_end_in_a_usage_error_before_any_output(
    variant: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        draft_step.main(["--out", str(out), "--variants", f"bf16,{variant}"])
    assert exc.value.code == 2
    assert "--variants: " in capsys.readouterr().err
    assert not out.exists()


def test_mimo_shapes_are_those_its_cuda_kernel_test_covers_without_the_bf16_input_proj() -> None:
    from tests.kernels.test_linear_drafter_shapes_cuda import SHAPES as MIMO_CUDA

    shapes = model.dense_shapes(model.SHAPES["mimo-7b"])
    assert "fc" not in shapes  # the plugin keeps MiMo's input_proj a BF16 nn.Linear
    assert {k: v for k, v in shapes.items() if k != "head32k"} == MIMO_CUDA
    assert shapes["head32k"] == (model.DRAFT_VOCAB, 4096)


def test_a_bf16_fc_is_read_and_counted_in_bf16_by_the_fp8_step() -> None:
    tiny = model.Shape("tiny-dense", 64, 40_000, 64, 16, 64, intermediate=96, fc_bf16=True)
    dev = torch.device("cpu")
    ws = model.build_weights(tiny, dev, seed=0, head_full=None)
    seen: list[model.Linear] = []

    def lin(x: torch.Tensor, w: model.Linear) -> torch.Tensor:
        seen.append(w)
        return torch.nn.functional.linear(x, w.bf16)

    emb, hid = (torch.randn(2, tiny.hidden).to(torch.bfloat16) for _ in range(2))
    logits, _ = model.step(tiny, ws, emb, hid, lin, None, False, glue="torch")
    assert logits.shape == (2, model.DRAFT_VOCAB)
    ids = {id(w) for w in seen}  # identity: a Linear's == compares tensors
    assert id(ws.fc) not in ids and {id(ws.qkv), id(ws.o), id(ws.head_draft)} <= ids
    fp8 = model.step_bytes(tiny, ws, True, full_head=False, distinct=0)
    bf16 = model.step_bytes(tiny, ws, False, full_head=False, distinct=0)
    fc = 2 * tiny.hidden * 2 * tiny.hidden
    assert bf16 - fc == 2 * (fp8 - fc)


# A small MoE drafter: the step's kernels at sizes that build in a moment.
TINY_MOE = model.Shape("tiny-moe", 1024, 4096, 2048, 256, 1024, experts=64, top_k=4,
                    moe_intermediate=256, shared_intermediate=256)  # fmt: skip


def tiny_moe_step_inputs(
    variant: str, tokens: int, seed: int
) -> tuple[model.WeightSet, torch.Tensor, torch.Tensor, model.LinearFn, model.MoeFn]:
    """``(weights, emb, hid, linear_fn, moe_fn)`` of a TINY_MOE step on CUDA: weights from
    ``seed``, inputs from ``tokens``."""
    dev = torch.device("cuda")
    ws = model.build_weights(TINY_MOE, dev, seed=seed, head_full=None)
    gen = torch.Generator(device=dev).manual_seed(tokens)
    emb = torch.randn(tokens, TINY_MOE.hidden, device=dev, generator=gen).to(torch.bfloat16)
    hid = torch.randn(tokens, TINY_MOE.hidden, device=dev, generator=gen).to(torch.bfloat16)
    lin = variants.linear_fn(variant)
    return ws, emb, hid, lin, variants.moe_fn(variant, "grouped")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(), reason="needs CUDA and triton")
@pytest.mark.parametrize("variant", ["bf16", "auto"])
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_shared_expert_beside_the_routed_ones_changes_no_bit(variant: str, tokens: int) -> None:
    dev = torch.device("cuda")
    ws, emb, hid, lin, moe = tiny_moe_step_inputs(variant, tokens, seed=3)
    prep = variants.prepare_fn(variant)
    mlp = variants.mlp_fn(variant)  # auto: the shared expert in one launch at 1-4 tokens (Hopper)

    def run(side: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        return model.step(TINY_MOE, ws, emb, hid, lin, moe, False, False, "fused", prep, side, mlp)

    want, want_ids = run(False)
    got, ids = run(True)
    assert torch.equal(got, want) and ids is not None and want_ids is not None and torch.equal(ids, want_ids)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured, _ = run(True)
    for seed in range(2):
        g = torch.Generator(device=dev).manual_seed(100 + seed)
        emb.copy_(torch.randn(emb.shape, device=dev, generator=g))
        hid.copy_(torch.randn(hid.shape, device=dev, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, run(False)[0])
    queued, single = timing.graph_times(lambda: run(True), reps=1, replays=3)
    assert queued > 0 and single > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(), reason="needs CUDA and triton")
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_shared_expert_in_one_launch_computes_what_three_do(tokens: int) -> None:
    ws, emb, hid, lin, moe = tiny_moe_step_inputs("auto", tokens, seed=4)
    prep = variants.prepare_fn("auto")
    args = (TINY_MOE, ws, emb, hid, lin, moe, False, False, "fused", prep, False)
    one, ids = model.step(*args, variants.mlp_fn("auto"))
    three, ids3 = model.step(*args, variants.mlp_fn("auto+nomlp"))
    assert ids is not None and ids3 is not None and torch.equal(ids, ids3)  # routing comes first
    # the one launch keeps SiLU * up in float32 where the three round it to bf16 twice
    assert float((one.double() - three.double()).norm() / three.double().norm()) < 2e-2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(), reason="needs CUDA and triton")
@pytest.mark.parametrize("tokens", [1, 4, 16])
@pytest.mark.parametrize(
    ("mlp_variant", "in_grouped"), [("auto", False), ("auto+nomlp", False), ("auto", True)]
)
def test_routed_experts_rows_from_the_residual_add_change_no_bit(
    tokens: int, mlp_variant: str, in_grouped: bool
) -> None:
    """``+moerows``: the add that writes h hands the routed experts (and the shared expert,
    inside the grouped launches) its FP8 rows; they are bit for bit the rows the experts' own
    per-token quantization gives."""
    ws, emb, hid, lin, moe = tiny_moe_step_inputs("auto", tokens, seed=5)
    args = (TINY_MOE, ws, emb, hid, lin, moe, False, in_grouped, "fused")
    rest = (variants.prepare_fn("auto"), False, variants.mlp_fn(mlp_variant))
    want, want_ids = model.step(*args, *rest, variants.variant_parts("auto").moe_rows)
    got, ids = model.step(*args, *rest, variants.variant_parts("auto+moerows").moe_rows)
    assert ids is not None and want_ids is not None and torch.equal(ids, want_ids)
    assert torch.equal(got, want)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(), reason="needs CUDA and triton")
@pytest.mark.parametrize("variant", ["bf16", "auto"])
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_shared_expert_in_the_grouped_launches_computes_what_its_own_do(variant: str, tokens: int) -> None:
    """The default step: the shared expert as one more expert of the grouped launches, its
    sigmoid gate as the routing weight, against the shared expert in launches of its own."""
    ws, emb, hid, lin, moe = tiny_moe_step_inputs(variant, tokens, seed=6)
    assert variants.variant_parts(variant).shared
    rest = ("fused", variants.prepare_fn(variant), False, variants.mlp_fn(variant))
    inside, ids = model.step(TINY_MOE, ws, emb, hid, lin, moe, False, True, *rest)
    own, own_ids = model.step(TINY_MOE, ws, emb, hid, lin, moe, False, False, *rest)
    assert ids is not None and own_ids is not None and torch.equal(ids, own_ids)  # routing comes first
    err = float((inside.double() - own.double()).norm() / own.double().norm())
    # BF16: the gate applied before the row is rounded rather than after. FP8: at 2+ tokens
    # the grouped launches quantize h per token (W8A8) where the one-launch shared expert
    # reads BF16 rows; the W8A8 bound of the other FP8 tests.
    assert err < (1e-2 if variant == "bf16" else 6e-2)


def check_every_variant_reads_the_bf16_routing(
    shape: model.Shape, dev: torch.device, variant: str, tokens: int, in_grouped: bool
) -> None:
    """By default each variant's MoE launches take the BF16 step's routing (``bf16_routing``):
    the step reports those experts, handing a step its own routing changes no bit, and
    another routing changes what it computes (the launches read the experts they are given)."""
    ws = model.build_weights(shape, dev, seed=7, head_full=None)
    gen = torch.Generator(device=dev).manual_seed(tokens)
    emb = torch.randn(tokens, shape.hidden, device=dev, generator=gen).to(torch.bfloat16)
    hid = torch.randn(tokens, shape.hidden, device=dev, generator=gen).to(torch.bfloat16)
    routing = variants.bf16_routing(shape, ws, emb, hid)
    assert routing is not None and routing.ids.shape == (tokens, shape.top_k)
    assert torch.equal(routing.with_shared[:, : shape.top_k], routing.ids)
    assert bool((routing.with_shared[:, -1] == shape.experts).all())
    bf16_lin, bf16_moe = variants.linear_fn("bf16"), variants.moe_fn("bf16", "grouped")
    _, bf16_ids = model.step(shape, ws, emb, hid, bf16_lin, bf16_moe, False, True)
    assert bf16_ids is not None and torch.equal(bf16_ids, routing.ids)

    lin, moe = variants.linear_fn(variant), variants.moe_fn(variant, "grouped")
    rest = ("fused", variants.prepare_fn(variant), False, variants.mlp_fn(variant), False)

    def run(route: model.Routing | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return model.step(shape, ws, emb, hid, lin, moe, False, in_grouped, *rest, route)

    own, own_ids = run(None)
    assert own_ids is not None
    own_ids = own_ids.contiguous()
    again, again_ids = run(model.Routing.of(own_ids, shape.experts))
    assert torch.equal(again, own) and again_ids is not None and torch.equal(again_ids, own_ids)
    _, ids = run(routing)
    assert ids is not None and torch.equal(ids, routing.ids)
    moved = (own_ids + 1) % shape.experts  # every pick moved to another expert
    other, other_ids = run(model.Routing.of(moved, shape.experts))
    assert other_ids is not None and torch.equal(other_ids, moved) and not torch.equal(other, own)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(), reason="needs CUDA and triton")
@pytest.mark.parametrize("in_grouped", [True, False])
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_every_variant_reads_the_experts_the_bf16_step_picks(in_grouped: bool, tokens: int) -> None:
    check_every_variant_reads_the_bf16_routing(TINY_MOE, torch.device("cuda"), "auto", tokens, in_grouped)


# Under Triton's interpreter (CPU): one token, where the grouped kernel's BF16 modes are FMA
# (the interpreter's BF16 tl.dot is wrong), at sizes it runs in seconds. Triton 3.9's
# interpreter (this suite's) runs it; 3.6's, on the GPU machines, stops with "only
# 0-dimensional arrays can be converted to Python scalars", as it does in
# tests/kernels/test_linear.py's interpreted test.
_INTERPRETED_ROUTING = """
import sys, torch
sys.path[:0] = [{root!r}]
from benchmarks.drafter_step import model
from tests.benchmarks.test_draft_step import check_every_variant_reads_the_bf16_routing as check
shape = model.Shape("micro-moe", 256, 512, 256, 64, 256, experts=16, top_k=4, moe_intermediate=64,
                 shared_intermediate=64)
for in_grouped in (True, False):
    check(shape, torch.device("cpu"), "bf16", 1, in_grouped)
print("routing ok")
"""


def test_every_variant_reads_the_bf16_routing_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    code = _INTERPRETED_ROUTING.format(root=str(root))
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=root
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "routing ok" in done.stdout


def test_candidate_launches_are_a_variant_s_python_settings() -> None:
    """``+gemv1=...`` and ``+moe1=...`` put candidate one-token entries in place of the tuning
    table's and the experts' measured configurations while the variant's graphs are captured
    (through Python, no environment switch); a malformed entry is refused naming its modifier."""
    from benchmarks.kernels import moe_tuned

    name = "auto+gemv1=4096x8192:2x1024x4x1;32768x4096:2x1024x4x2x12+moe1=1024:32x128x2"
    parts = variants.variant_parts(name)
    assert parts.gemv_one_token[(4096, 8192)] == tuning.Entry(False, 2, 1024, 4, 3, 4, 0, False, True, 0, 1)
    assert parts.gemv_one_token[(32768, 4096)].waves == 12 and parts.moe_one_token == {
        1024: (32, 128, 2, 3, moe_tuned.FMA_NARROW)
    }
    table = tuning.for_device()
    with variants.variant_settings(name):
        inside = tuning.for_device()
        assert (
            inside.skinny[(1, 4096, 8192)].first_ahead == 1
            and inside.skinny[(4, 4096, 8192)] == table.skinny[(4, 4096, 8192)]
        )
        assert moe_tuned.default_config(1, 4096, 1024, fp8=True) == (32, 128, 2, 3, moe_tuned.FMA_NARROW)
    assert tuning.for_device() is table
    assert moe_tuned.default_config(1, 4096, 1024, fp8=True) == (64, 128, 4, 3, moe_tuned.FMA_NARROW)
    for bad, message in (
        ("auto+gemv1=4096x8192:2x1024", r"\+gemv1: '4096x8192:2x1024'"),
        ("auto+moe1=down:1x2x3", r"\+moe1"),
    ):
        with pytest.raises(ValueError, match=message):
            variants.variant_parts(bad)
