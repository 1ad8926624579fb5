"""The one-launch FP8 gated MLP (``triton_mlp``, ``fp8_mlp``) against a float64 reference.

Skipped where no CUDA device is present (CI); run on the GPU machine with
``python -m pytest -q tests/kernels/test_mlp_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mtpconv.formats.fp8 import quantize_fp8
from tests.helpers import rel_error
from tests.kernels.graph_replay import replays_match_eager

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _weights(h: int, i: int, per_row: bool, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    gu = quantize_fp8(torch.randn(2 * i, h, generator=g) / h**0.5)
    dn = quantize_fp8(torch.randn(h, i, generator=g) / i**0.5)
    gs, ds = gu.scale, dn.scale
    if per_row:  # distinct scales per row, as fused shards with their own scales give
        gs = gs * (torch.rand(2 * i, generator=g) + 0.5)
        ds = ds * (torch.rand(h, generator=g) + 0.5)
    return tuple(t.cuda() for t in (gu.weight, gs, dn.weight, ds))


def _reference(
    x: torch.Tensor, gu: torch.Tensor, gs: torch.Tensor, dn: torch.Tensor, ds: torch.Tensor
) -> torch.Tensor:
    def deq(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return w.double() * (s.double().reshape(-1, 1) if s.numel() > 1 else s.double())

    y = x.double() @ deq(gu, gs).T
    i = y.shape[-1] // 2
    return (F.silu(y[:, :i]) * y[:, i:]) @ deq(dn, ds).T


# (H, I): Qwen3.5-397B and Qwen3-Next-80B shared experts; uneven H; I not a power of two
# and wider than a program's down tile (several down units a program); tiny.
SHAPES = [(4096, 1024), (2048, 512), (1040, 40), (2048, 600), (1024, 2048), (64, 16)]


def _check(y: torch.Tensor, ref: torch.Tensor, what: object) -> None:
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape, what
    # weight-only numerics: float32 sums, one bf16 rounding of the output
    assert rel_error(y, ref) < 1e-2, what
    assert float((y.double() - ref).abs().max()) <= 1e-2 * float(ref.abs().max()), what


@pytest.mark.parametrize(("h", "i"), SHAPES)
@pytest.mark.parametrize("tokens", [1, 2, 3, 4])
@pytest.mark.parametrize("per_row", [False, True])
def test_fused_mlp_matches_the_dequantized_reference(h: int, i: int, tokens: int, per_row: bool) -> None:
    """One launch and two; each token's intermediate loaded first and one at a time."""
    from mtpconv.kernels import triton_mlp

    gu, gs, dn, ds = _weights(h, i, per_row, seed=h + i + tokens)
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, h, device="cuda", generator=g).to(torch.bfloat16)
    ref = _reference(x, gu, gs, dn, ds)
    _check(triton_mlp.fused_mlp(x, gu, gs, dn, ds), ref, (h, i, tokens))
    for split in (False, True):
        for act_first in (False, True):
            y = triton_mlp.fused_mlp(x, gu, gs, dn, ds, split=split, act_first=act_first)
            _check(y, ref, (h, i, tokens, split, act_first))


@pytest.mark.parametrize(("h", "i"), [(4096, 1024), (1040, 40)])
@pytest.mark.parametrize("tokens", [1, 4])
def test_every_unroll_and_the_two_launch_form_agree(h: int, i: int, tokens: int) -> None:
    from mtpconv.kernels import triton_mlp

    gu, gs, dn, ds = _weights(h, i, True, seed=7)
    x = torch.randn(tokens, h, device="cuda").to(torch.bfloat16)
    ref = _reference(x, gu, gs, dn, ds)
    for split in (False, True):
        for unroll in (1, 2, 4):
            for per_sm in (1, 2, 4):
                y = triton_mlp.fused_mlp(x, gu, gs, dn, ds, split=split, unroll=unroll, per_sm=per_sm)
                _check(y, ref, (split, unroll, per_sm))


def test_fused_mlp_repeats_bit_for_bit_and_keeps_leading_dims() -> None:
    from mtpconv.kernels import triton_mlp

    gu, gs, dn, ds = _weights(4096, 1024, False, seed=1)
    x = torch.randn(1, 3, 4096, device="cuda").to(torch.bfloat16)
    first = triton_mlp.fused_mlp(x, gu, gs, dn, ds)
    assert first.shape == (1, 3, 4096)
    for _ in range(20):  # the barrier's counter only grows: every launch meets it again
        assert torch.equal(triton_mlp.fused_mlp(x, gu, gs, dn, ds), first)
    assert torch.equal(triton_mlp.fused_mlp(x, gu, gs, dn, ds, split=True), first)


@pytest.mark.parametrize("mode", ["0", "early", "late"])
def test_fused_mlp_in_a_graph_after_a_producer_sees_each_replays_rows(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Captured behind our PDL producer (SiLU * up) and in front of a linear on its output:
    every replay, with fresh inputs, gives the bytes of the same chain run eagerly."""
    from mtpconv.kernels import fp8_linear, triton_glue, triton_mlp

    gu, gs, dn, ds = _weights(2048, 512, True, seed=5)
    after = quantize_fp8(torch.randn(256, 2048))
    w_after, s_after = after.weight.cuda(), after.scale.cuda()
    src = torch.empty(4, 4096, device="cuda", dtype=torch.bfloat16)

    def chain() -> list[torch.Tensor]:
        x = triton_glue.silu_mul(src)
        y = triton_mlp.fused_mlp(x, gu, gs, dn, ds)
        z = triton_mlp.fused_mlp(y, gu, gs, dn, ds)  # two in a row: the counter and workspace reused
        return [y, z, fp8_linear(z, w_after, s_after)]

    def refresh() -> None:
        src.copy_(torch.randn(4, 4096))

    refresh()
    replays_match_eager(chain, chain, refresh, mode, monkeypatch)


def test_fp8_mlp_takes_one_launch_here_and_three_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    from mtpconv.kernels import fp8_mlp, mlp

    gu, gs, dn, ds = _weights(4096, 1024, False, seed=2)
    x = torch.randn(4, 4096, device="cuda").to(torch.bfloat16)
    ref = _reference(x, gu, gs, dn, ds)
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    assert mlp.fused_here(x) == hopper
    one = fp8_mlp(x, gu, gs, dn, ds)
    monkeypatch.setenv(mlp.ENV, "0")
    assert not mlp.fused_here(x)
    three = fp8_mlp(x, gu, gs, dn, ds)
    # the three launches' down projection at 2-16 rows quantizes its input per token on the
    # shapes of the tuning table's skinny_token shapes (397B's among them): the W8A8 bound of the other tests
    assert rel_error(one, ref) < 1e-2 and rel_error(three, ref) < 6e-2
    if hopper:
        from mtpconv.kernels import triton_mlp

        monkeypatch.delenv(mlp.ENV)
        assert torch.equal(one, triton_mlp.fused_mlp(x, gu, gs, dn, ds))
    # beyond 4 rows, the three launches
    x16 = torch.randn(16, 4096, device="cuda").to(torch.bfloat16)
    # (FP8 activations there, W8A8 error: the bound of the other W8A8 tests)
    assert rel_error(fp8_mlp(x16, gu, gs, dn, ds), _reference(x16, gu, gs, dn, ds)) < 6e-2


def test_fused_mlp_refuses_what_it_cannot_run() -> None:
    from mtpconv.kernels import triton_mlp

    gu, gs, dn, ds = _weights(256, 64, False, seed=3)
    x = torch.randn(5, 256, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="1-4 rows"):
        triton_mlp.fused_mlp(x, gu, gs, dn, ds)
    blocks = torch.ones(1, 2, device="cuda")
    with pytest.raises(ValueError, match="per-row scales"):
        triton_mlp.fused_mlp(x[:2], gu, blocks, dn, ds)
