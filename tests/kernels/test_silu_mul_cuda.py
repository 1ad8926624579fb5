"""The product's ``silu_mul`` (``mtpconv.kernels.triton_glue``: an FP8 MLP's three launches) against torch.

Skipped where no CUDA device is present (CI); run on the GPU machine with
``python -m pytest -q tests/kernels/test_silu_mul_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize(("tokens", "inter"), [(1, 1024), (4, 17408), (16, 512), (3, 1000)])
def test_silu_mul_matches_torch(tokens: int, inter: int) -> None:
    from mtpconv.kernels import triton_glue

    g = torch.Generator(device="cuda").manual_seed(inter)
    x = (torch.randn(tokens, 2 * inter, device="cuda", generator=g) * 4).to(torch.bfloat16)
    gate, up = x.float().chunk(2, dim=-1)
    ref = F.silu(gate) * up
    out = triton_glue.silu_mul(x)
    assert out.dtype == torch.bfloat16 and out.shape == (tokens, inter)
    # float32 arithmetic, one rounding to bfloat16 (within one ulp)
    torch.testing.assert_close(out.float(), ref, rtol=2**-7, atol=1e-6)
    with pytest.raises(ValueError, match="not \\[T, 2I\\]"):
        triton_glue.silu_mul(x[:, :-1])
