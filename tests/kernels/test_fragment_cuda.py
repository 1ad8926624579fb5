"""CUDA tests: the FP16 MMA on register fragments (``Config.mma == 3``).

Skipped where no CUDA device is present (CI). Run on the GPU machine with
``PYTHONPATH=. python -m pytest -q tests/kernels/test_fragment_cuda.py``.

Tolerance: weight-only numerics (FP8 weights exact in FP16, activations rounded to
FP16 after an exact 2**-6 scaling, float32 sums, one bf16 rounding of the output):
norm-wise 1e-2 relative and every element within 1e-2 of the largest |ref|.
"""

from __future__ import annotations

import pytest
import torch

from mtpconv.kernels import triton_available
from tests.kernels.test_linear_cuda import _case, _ref, _rel

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not triton_available(), reason="needs CUDA and triton"
    ),
]

# (block_n, block_k, warps): 2, 4 and 8 row groups of 8 per warp, K steps of 1-8 x 32
TILES = [(64, 128, 4), (128, 64, 4), (256, 32, 4), (32, 256, 2), (128, 128, 8), (64, 256, 4)]
# K a multiple of 16 (the kernel's condition); 1008 and 208 leave a partial last K step
SHAPES = [
    (1, 5120, 6144),
    (2, 333, 1008),
    (4, 384, 2048),
    (8, 130, 5120),
    (9, 256, 512),
    (16, 640, 1536),
    (33, 96, 208),
]


def _check(y: torch.Tensor, ref: torch.Tensor, what: object) -> None:
    assert _rel(y, ref) < 1e-2, (what, _rel(y, ref))
    assert float((y.double() - ref).abs().max()) <= 1e-2 * float(ref.abs().max()), what


def _fragment(block_n: int, block_k: int, warps: int, programs: int, mma: int = 3):
    from mtpconv.kernels import triton_skinny as ts

    return ts.Config(True, block_n, block_k, warps, 3, programs, mma=mma)


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("layout", ["tensor", "row"])
def test_fragment_matches_dequantized_reference(m: int, n: int, k: int, layout: str) -> None:
    from mtpconv.kernels import triton_fragment
    from mtpconv.kernels import triton_skinny as ts

    x, w, s, b = _case(m, n, k, layout, bias=layout == "row")
    ref = _ref(x, w, s, b)
    for block_n, block_k, warps in TILES:
        assert triton_fragment.usable(x, w, block_n, block_k, warps)
        # no split, and as many K pieces as the shape allows; mma 5: with prefetch
        for programs, mma in ((1, 3), (1 << 20, 3), (1, 5), (1 << 20, 5)):
            cfg = _fragment(block_n, block_k, warps, programs, mma)
            y = ts.skinny_linear(x, w, s, b, config=cfg)
            _check(y, ref, cfg)
            # deterministic, and the split counters reset themselves between launches
            assert torch.equal(y, ts.skinny_linear(x, w, s, b, config=cfg)), cfg


@pytest.mark.parametrize("magnitude", [1e-3, 1.0, 3e3, 1e5])
def test_fragment_activation_range(magnitude: float) -> None:
    """Activations from 1e-3 to 1e5 (beyond FP16's 65504 before the 2**-6 scaling)."""
    from mtpconv.kernels import triton_skinny as ts

    x, w, s, _ = _case(16, 512, 2048, "tensor", bias=False)
    x = (x.float() * magnitude).to(torch.bfloat16)
    x[3, 5] = magnitude * 40  # one outlier channel
    ref = _ref(x, w, s, None)
    _check(ts.skinny_linear(x, w, s, config=_fragment(64, 128, 4, 1 << 20)), ref, magnitude)


def test_fragment_in_cuda_graph_replays() -> None:
    from mtpconv.kernels import triton_skinny as ts

    x, w, s, _ = _case(12, 2048, 8192, "row", bias=False)
    cfg = _fragment(64, 128, 4, 1 << 20)
    assert ts.split_for(32, 8192, cfg.block_k, cfg.programs)[0] > 1
    ts.skinny_linear(x, w, s, config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a = ts.skinny_linear(x, w, s, config=cfg)
        c = ts.skinny_linear(x * 2, w, s, config=cfg)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(a, ts.skinny_linear(x, w, s, config=cfg))
        _check(c, _ref(x * 2, w, s, None), "graph")


def test_fragment_falls_back_where_its_layout_does_not_hold() -> None:
    """Block scales, FP16 activations and rows not 16-aligned take the FP8-MMA kernel."""
    from mtpconv.kernels import triton_fragment
    from mtpconv.kernels import triton_skinny as ts

    cfg = _fragment(64, 128, 4, 1 << 20)
    x, w, s, _ = _case(4, 256, 1024, "block", bias=False)
    assert _rel(ts.skinny_linear(x, w, s, config=cfg), _ref(x, w, s, None)) < 6e-2
    x, w, s, _ = _case(4, 256, 1032, "tensor", bias=False)
    xs = x[:, 8:]  # row stride 1032: not a multiple of 16
    ws = w[:, 8:]
    assert not triton_fragment.usable(xs, ws, 64, 128, 4)
    assert _rel(ts.skinny_linear(xs, ws, s, config=cfg), _ref(xs, ws, s, None)) < 6e-2
    xh = x.half()
    assert not triton_fragment.usable(xh, w, 64, 128, 4)
    assert _rel(ts.skinny_linear(xh, w, s, config=cfg), _ref(xh, w, s, None)) < 6e-2
