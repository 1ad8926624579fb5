"""CUDA tests: ``fp8_linear`` on a MiMo-7B drafter's shapes, as vLLM's Model Runner V2 runs it.

Shapes the tuning table names no entry for (K = 11,008 is no power of two), every token count a
draft pass sends (1-16, and 32 for a batch-8 draft prefill), weights that are zero (the planted
checkpoints' output projections) or not, per-row and per-tensor scales. The tensors sit inside
NaN-filled memory: a kernel that read one element outside them would return NaN, which a zero
weight row does not hide. Then the drafter's four linears captured in CUDA graphs the way V2
captures its draft passes: warmed up and captured on a side stream, largest size first, into one
shared memory pool, replayed on the main stream with new inputs.

Skipped where no CUDA device is present (CI). Run on the GPU machine with
``PYTHONPATH=. python -m pytest -q tests/kernels/test_linear_drafter_shapes_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.kernels import fp8_linear, reference
from tests.helpers import rel_error

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEV = torch.device("cuda")
# MiMo-7B's drafter linears: fused qkv (32 + 8 + 8 heads of 128), o, fused gate/up, down.
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}
TOKENS = [1, 2, 3, 4, 5, 8, 12, 16, 32]
GUARD = 4096  # elements of NaN on each side of a guarded tensor
FP8_NAN = 0x7F  # e4m3fn's NaN bit pattern


def _guarded(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` (on the GPU) inside a buffer whose other elements are NaN."""
    flat = t.reshape(-1)
    if t.dtype == torch.float8_e4m3fn:
        buf = torch.full((flat.numel() + 2 * GUARD,), FP8_NAN, dtype=torch.uint8, device=DEV)
        buf = buf.view(torch.float8_e4m3fn)
    else:
        buf = torch.full((flat.numel() + 2 * GUARD,), float("nan"), dtype=t.dtype, device=DEV)
    buf[GUARD : GUARD + flat.numel()].copy_(flat)
    return buf[GUARD : GUARD + flat.numel()].view(t.shape)


def _weight(n: int, k: int, *, zero: bool, per_row: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.zeros(n, k) if zero else torch.randn(n, k, generator=g) * 0.02
    if not per_row:
        q = quantize_fp8(w)
        return _guarded(q.weight.to(DEV)), q.scale.reshape(()).to(DEV)
    fp8, rows = reference.quant_per_token(w)  # one scale per output row
    return _guarded(fp8.to(DEV)), rows.reshape(-1).to(DEV)


def _input(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return _guarded(torch.randn(m, k, generator=g).to(torch.bfloat16).to(DEV))


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("per_row", [True, False], ids=["row", "tensor"])
@pytest.mark.parametrize("zero", [True, False], ids=["zero", "random"])
def test_every_token_count_reads_only_its_tensors(name: str, per_row: bool, zero: bool) -> None:
    n, k = SHAPES[name]
    w, s = _weight(n, k, zero=zero, per_row=per_row, seed=1)
    for m in TOKENS:
        x = _input(m, k, seed=m)
        y = fp8_linear(x, w, s)
        torch.cuda.synchronize()
        assert bool(torch.isfinite(y).all()), f"{name} m={m}: non-finite output"
        if zero:
            assert not bool(y.any()), f"{name} m={m}: a zero weight gave a non-zero output"
        else:
            ref = reference.dequant_linear(x.double(), w, s.double())
            assert rel_error(y, ref) < 6e-2, f"{name} m={m}"


def _drafter_pass(x: torch.Tensor, weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The drafter layer's linears in order, shaped as they are chained (not its math)."""
    qkv = fp8_linear(x, *weights["qkv"])
    o = fp8_linear(qkv[:, :4096].contiguous(), *weights["o"])
    gate_up = fp8_linear(o + x, *weights["gate_up"])
    act = torch.nn.functional.silu(gate_up[:, :11008]) * gate_up[:, 11008:]
    return fp8_linear(act, *weights["down"]) + o


@pytest.mark.parametrize("zero_outputs", [True, False], ids=["planted", "random"])
def test_drafter_linears_in_graphs_captured_as_model_runner_v2_does(zero_outputs: bool) -> None:
    weights = {
        name: _weight(n, k, zero=zero_outputs and name in ("o", "down"), per_row=True, seed=i)
        for i, (name, (n, k)) in enumerate(SHAPES.items())
    }
    sizes = sorted(TOKENS, reverse=True)
    static = {m: torch.zeros(m, 4096, dtype=torch.bfloat16, device=DEV) for m in sizes}
    outputs: dict[int, torch.Tensor] = {}
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    pool = torch.cuda.graph_pool_handle()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for m in sizes:
            static[m].copy_(torch.randn(m, 4096, device=DEV).to(torch.bfloat16))
            _drafter_pass(static[m], weights)  # warm-up, then capture, on the same stream
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=side):
                outputs[m] = _drafter_pass(static[m], weights)
            graphs[m] = graph
    torch.cuda.current_stream().wait_stream(side)
    for round_ in range(3):
        for m in [1, 16, 4, 1, 32, 2, 8, 1]:  # the order of a batch's draft passes varies
            static[m].copy_(torch.randn(m, 4096, device=DEV).to(torch.bfloat16))
            graphs[m].replay()
            torch.cuda.synchronize()
            got = outputs[m].clone()
            want = _drafter_pass(static[m], weights)
            assert bool(torch.isfinite(got).all()), f"round {round_} m={m}: non-finite output"
            if zero_outputs:
                assert not bool(got.any()), f"round {round_} m={m}: zero output projections gave non-zero"
            else:
                assert torch.equal(got, want), f"round {round_} m={m}: replay differs from eager"
