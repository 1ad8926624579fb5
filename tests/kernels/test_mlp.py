"""``fp8_mlp`` off the GPU: which inputs the one-launch kernel takes, and the three-launch
form's numerics (the kernel itself: ``test_mlp_cuda.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.kernels import fp8_mlp, mlp


def _fp8(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = quantize_fp8(torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)))
    return q.weight, q.scale


def test_fits_takes_one_to_four_rows_of_matching_fp8_weights() -> None:
    gu, gs = _fp8(128, 64, 0)
    dn, ds = _fp8(64, 64, 1)

    def rows(m: int, h: int = 64) -> torch.Tensor:
        return torch.zeros(m, h, dtype=torch.bfloat16)

    assert all(mlp.fits(rows(m), gu, gs, dn, ds) for m in (1, 2, 3, 4))
    assert mlp.fits(torch.zeros(2, 2, 64), gu, gs, dn, ds)  # leading dims: 4 rows
    assert not mlp.fits(rows(0), gu, gs, dn, ds)
    assert not mlp.fits(rows(5), gu, gs, dn, ds)
    assert not mlp.fits(rows(2, 32), gu, gs, dn, ds)  # x's width is not H
    assert mlp.fits(rows(2), gu, torch.ones(128), dn, torch.ones(64))  # per-row scales
    assert not mlp.fits(rows(2), gu, torch.ones(2, 2), dn, ds)  # 128x128 blocks: three launches
    assert not mlp.fits(rows(2), gu, gs, dn[:, :32].contiguous(), ds)  # down's K is not I
    assert not mlp.fits(rows(2), gu.to(torch.bfloat16), gs, dn, ds)
    assert not mlp.fits(rows(2), gu.t(), gs, dn, ds)  # not contiguous
    odd, odd_s = _fp8(128, 24, 2)
    assert not mlp.fits(rows(2, 24), odd, odd_s, _fp8(24, 64, 3)[0], ds)  # H = 24 is not a multiple of 16


def test_cpu_takes_the_three_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert not mlp.fused_here(x)
    monkeypatch.setenv(mlp.ENV, "0")
    assert not mlp.fused_here(x)


@pytest.mark.parametrize("tokens", [1, 4, 9])
def test_fp8_mlp_is_silu_gate_times_up_then_down(tokens: int) -> None:
    gu, gs = _fp8(2 * 48, 64, 4)
    dn, ds = _fp8(64, 48, 5)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens)).to(torch.bfloat16)
    y = x.double() @ (gu.double() * gs.double()).T
    ref = (F.silu(y[:, :48]) * y[:, 48:]) @ (dn.double() * ds.double()).T
    out = fp8_mlp(x, gu, gs, dn, ds)
    assert out.dtype == torch.bfloat16 and out.shape == (tokens, 64)
    assert float((out.double() - ref).norm() / ref.norm()) < 2e-2  # two bf16 roundings between


def test_fp8_mlp_keeps_leading_dims() -> None:
    gu, gs = _fp8(32, 16, 6)
    dn, ds = _fp8(16, 16, 7)
    x = torch.randn(2, 3, 16).to(torch.bfloat16)
    assert fp8_mlp(x, gu, gs, dn, ds).shape == (2, 3, 16)


def test_one_launch_defaults_follow_the_measurements() -> None:
    pytest.importorskip("triton")
    from mtpconv.kernels import triton_mlp

    assert triton_mlp.default_unroll(4096) == 4 and triton_mlp.default_unroll(2048) == 2
    assert triton_mlp.default_unroll(7168) == 4 and triton_mlp.default_unroll(64) == 1
    assert triton_mlp.default_per_sm(1, 4096) == 4  # 397B's shared expert at one token
    assert triton_mlp.default_per_sm(4, 4096) == 2 and triton_mlp.default_per_sm(1, 2048) == 2
    assert triton_mlp.default_unroll(4096, block_k=2048) == 2  # 8 warps: 2048-wide K steps


def test_one_launch_refuses_unsupported_warps_and_programs() -> None:
    pytest.importorskip("triton")
    from mtpconv.kernels import triton_mlp

    gu, gs = _fp8(64, 32, 10)
    dn, ds = _fp8(32, 32, 11)
    x = torch.randn(2, 32).to(torch.bfloat16)
    with pytest.raises(ValueError, match="warps is 4 or 8, got 3"):
        triton_mlp.fused_mlp(x, gu, gs, dn, ds, warps=3)
    with pytest.raises(ValueError, match="per_sm is 1, 2 or 4, got 3"):
        triton_mlp.fused_mlp(x, gu, gs, dn, ds, per_sm=3)


def test_fp8_mlp_names_mismatched_shapes() -> None:
    gu, gs = _fp8(64, 32, 8)
    dn, ds = _fp8(32, 32, 9)
    x = torch.randn(2, 32).to(torch.bfloat16)
    assert fp8_mlp(x, gu, gs, dn, ds).shape == (2, 32)
    for args in (
        (x[:, :16], gu, gs, dn, ds),  # x's width is not H
        (x, gu[:63], gs, dn, ds),  # an odd number of gate / up rows
        (x, gu, gs, dn[:, :8], ds),  # down's K is not I
    ):
        with pytest.raises(ValueError, match=r"gate_up \[2I, H\] and down \[H, I\]"):
            fp8_mlp(*args)
