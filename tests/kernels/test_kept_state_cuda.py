"""The kernels' kept state under vLLM Model Runner V2's capture pattern (CUDA).

V2 warms each batch size up eagerly on one stream, then captures it on torch's side stream
(``torch.cuda.graph(graph, pool)``), sizes in turn, into one shared pool. State the kernels
keep per stream (split-K counters, quantizer barriers, rows of ones) is then first asked for
inside the first capture, where a fill is only recorded. This replays a graph captured after
another one, never replaying the first, in a pool whose memory a replayed graph left dirty,
and wants the eager bytes. On an H100 (2026-12-07) it also passed with captured state cached
as before :mod:`mtpconv.kernels.kept_state`: it guards the rule, it has not shown a failure.

``PYTHONPATH=. python -m pytest -q tests/kernels/test_kept_state_cuda.py``
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from mtpconv.formats.e4m3 import FP8_MAX
from mtpconv.kernels import linear, triton_available

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not triton_available(), reason="needs triton"),
]
DEV = torch.device("cuda")


@pytest.fixture(autouse=True)
def _no_state_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every registry starts empty, as in a fresh vLLM worker."""
    from mtpconv.kernels import triton_mlp, triton_quant, triton_quant_tensor, triton_skinny

    for module, name in (
        (triton_skinny, "_WORK"),
        (triton_quant, "_AGREEMENT"),
        (triton_quant_tensor, "_SYNC"),
        (triton_mlp, "_ACT"),
        (linear, "_ONES"),
    ):
        monkeypatch.setattr(module, name, {})


def _weight(n: int, k: int, uniform: bool) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k, device=DEV) * 0.02
    s = w.abs().amax(dim=1) / FP8_MAX
    q = (w / s[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, (s[:1].reshape(()).clone() if uniform else s)


def _dirty_pool(pool: object) -> None:
    """Fill the pool's memory with a replayed graph's garbage, then free it back to the pool."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool):
        junk = [torch.empty(size, dtype=torch.uint8, device=DEV) for size in [64 << 20] + [1 << 16] * 64]
        for block in junk:  # large and small blocks: the counters come from the small pool
            block.fill_(0x5A)
    graph.replay()
    torch.cuda.synchronize()
    del junk


def _v2_capture(run: Callable[[torch.Tensor], torch.Tensor], sizes: list[int], k: int) -> None:
    """Warm up on one stream, capture each size on torch's side stream in one dirty pool;
    replay only the last graph captured and compare with eager calls."""
    inputs = {m: torch.randn(m, k, device=DEV, dtype=torch.bfloat16) for m in sizes}
    pool = torch.cuda.graph_pool_handle()
    _dirty_pool(pool)
    warm = torch.cuda.Stream()
    graphs, outs = {}, {}
    with torch.cuda.stream(warm):
        for m in sizes:
            run(inputs[m])  # V2's warm-up, eager, on the stream of graph_capture()
            warm.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):  # torch's side stream
                outs[m] = run(inputs[m])
            graphs[m] = graph
    last = sizes[-1]
    for _ in range(3):
        inputs[last].copy_(torch.randn_like(inputs[last]))
        graphs[last].replay()
        torch.cuda.synchronize()
        want = run(inputs[last])
        torch.cuda.synchronize()
        assert torch.equal(outs[last], want), (last, (outs[last].float() - want.float()).abs().max())


@pytest.mark.parametrize("uniform", [False, True], ids=["row-scales", "one-scale"])
@pytest.mark.parametrize(
    ("kernel", "sizes"),
    [
        (linear.WoSkinny, [16, 4, 1]),  # split-K arrival counters
        (linear.ScaledMmToken, [64, 32]),  # per-token quantizer; a row of ones for one scale
        (linear.ScaledMmFused, [64, 32]),  # per-tensor quantizer's barrier; ones for row scales
    ],
    ids=lambda v: v.name if isinstance(v, type) else None,
)
def test_a_graph_captured_after_another_replays_alone(
    kernel: type[linear.Fp8LinearKernel], sizes: list[int], uniform: bool
) -> None:
    n, k = 256, 11008  # few output tiles, so the skinny GEMM splits K
    w, s = _weight(n, k, uniform)
    _v2_capture(lambda x: linear.fp8_linear(x, w, s, kernel=kernel), sizes, k)


def test_the_fp8_linear_choice_on_mimo_shapes_replays_alone() -> None:
    """MiMo-7B's drafter linears, the kernel ``fp8_linear`` picks on this GPU, V2's pattern."""
    for n, k in ((6144, 4096), (4096, 4096), (22016, 4096), (4096, 11008)):
        for uniform in (False, True):
            w, s = _weight(n, k, uniform)
            _v2_capture(lambda x, w=w, s=s: linear.fp8_linear(x, w, s), [32, 8, 4, 1], k)
