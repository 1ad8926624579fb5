"""The custom op wrapping fp8_mlp: same result, a fake that gives the output's shape and
dtype, one full graph under ``torch.compile``, and defined by the plugin's ``register``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.kernels import fp8_mlp, fp8_mlp_op

H, INTER = 48, 32


def _weights(per_row: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    gu = quantize_fp8(torch.randn(2 * INTER, H, generator=g))
    dn = quantize_fp8(torch.randn(H, INTER, generator=g))
    if per_row:
        return (
            gu.weight,
            gu.scale * torch.linspace(0.5, 1.5, 2 * INTER),
            dn.weight,
            dn.scale * torch.rand(H, generator=g),
        )
    return gu.weight, gu.scale, dn.weight, dn.scale


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("lead", [(1,), (5,), (2, 3)])
def test_op_equals_function(per_row: bool, lead: tuple[int, ...]) -> None:
    w = _weights(per_row)
    x = torch.randn(*lead, H).to(torch.bfloat16)
    out = torch.ops.mtpconv.fp8_mlp(x, *w)
    assert out.shape == (*lead, H) and out.dtype == torch.bfloat16
    assert torch.equal(out, fp8_mlp(x, *w))
    assert torch.equal(fp8_mlp_op(x, *w), out)


def test_fake_gives_the_output_shape_and_dtype() -> None:
    with FakeTensorMode():
        x = torch.empty(2, 5, H, dtype=torch.bfloat16)
        gu = torch.empty(2 * INTER, H, dtype=torch.float8_e4m3fn)
        dn = torch.empty(H, INTER, dtype=torch.float8_e4m3fn)
        out = torch.ops.mtpconv.fp8_mlp(x, gu, torch.empty(()), dn, torch.empty(H))
    assert isinstance(out, FakeTensor)
    assert out.shape == (2, 5, H) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("per_row", [False, True])
def test_opcheck(per_row: bool) -> None:
    """torch's own checks of the fake against the real op (``test_schema`` is left out: its
    mutation check compares the FP8 inputs with ``allclose``, which CPU torch lacks for FP8)."""
    x = torch.randn(3, H).to(torch.bfloat16)
    checks = ("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration")
    result = torch.library.opcheck(
        torch.ops.mtpconv.fp8_mlp.default, (x, *_weights(per_row)), test_utils=checks
    )
    assert result == dict.fromkeys(checks, "SUCCESS")


def test_op_compiles_fullgraph_with_dynamic_tokens() -> None:
    w = _weights(False)
    torch._dynamo.reset()
    f = torch.compile(lambda x: fp8_mlp_op(x, *w) * 2, fullgraph=True, dynamic=True, backend="eager")
    for tokens in (1, 3, 17):
        x = torch.randn(tokens, H).to(torch.bfloat16)
        assert torch.equal(f(x), fp8_mlp(x, *w) * 2)
    torch._dynamo.reset()


# A fresh interpreter: in this one other tests have already imported the op.
_REGISTER_PROBE = """
import sys
sys.modules["vllm"] = None  # the op must not depend on vLLM being importable
import torch
import mtpconv.vllm_plugin as plugin
before = hasattr(torch.ops.mtpconv, "fp8_mlp")
plugin.register()
x = torch.ones(1, 16)
gate_up = torch.ones(4, 16).to(torch.float8_e4m3fn)
down = torch.ones(16, 2).to(torch.float8_e4m3fn)
y = torch.ops.mtpconv.fp8_mlp(x, gate_up, torch.tensor(0.125), down, torch.tensor(0.5))
print(before, hasattr(torch.ops.mtpconv, "fp8_mlp"), round(y[0, 0].item(), 4), tuple(y.shape))
"""


def test_plugin_register_defines_the_op() -> None:
    """vLLM's AOT cache restores graphs naming the op after plugin load: register() defines it."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    done = subprocess.run(
        [sys.executable, "-c", _REGISTER_PROBE], capture_output=True, text=True, env=env, check=True
    )
    # gate = up = 16 * 0.125 = 2; SiLU(2) * 2 = 3.5232; down: 2 * 3.5232 * 0.5 = 3.5232.
    assert done.stdout.split() == ["False", "True", "3.5232", "(1,", "16)"]
