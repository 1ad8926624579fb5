"""The custom op wrapping fp8_linear: same result, and it compiles as one full graph."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.kernels import fp8_linear, fp8_linear_op


def _operands(n: int = 48, k: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = quantize_fp8(torch.randn(n, k, generator=g))
    return q.weight, q.scale, torch.randn(n, generator=g)


def test_op_equals_function() -> None:
    w, s, b = _operands()
    x = torch.randn(5, 32)
    assert torch.equal(fp8_linear_op(x, w, s, b), fp8_linear(x, w, s, b))
    assert torch.equal(torch.ops.mtpconv.fp8_linear(x, w, s, None), fp8_linear(x, w, s))


def test_op_compiles_fullgraph_with_dynamic_tokens() -> None:
    w, s, b = _operands()
    torch._dynamo.reset()
    f = torch.compile(lambda x: fp8_linear_op(x, w, s, b) * 2, fullgraph=True, dynamic=True, backend="eager")
    for tokens in (1, 3, 17):
        x = torch.randn(tokens, 32)
        assert torch.equal(f(x), fp8_linear(x, w, s, b) * 2)


# A fresh interpreter: in this one other tests have already imported the op.
_REGISTER_PROBE = """
import sys
sys.modules["vllm"] = None  # the op must not depend on vLLM being importable
import torch
import mtpconv.vllm_plugin as plugin
before = hasattr(torch.ops.mtpconv, "fp8_linear")
plugin.register()
x = torch.ones(2, 4)
w = torch.ones(3, 4).to(torch.float8_e4m3fn)
y = torch.ops.mtpconv.fp8_linear(x, w, torch.tensor(0.5), None)
print(before, hasattr(torch.ops.mtpconv, "fp8_linear"), y.tolist())
"""


def test_plugin_register_defines_the_op_on_cpu() -> None:
    """vLLM's AOT cache restores graphs naming the op after plugin load: register() defines it."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    done = subprocess.run(
        [sys.executable, "-c", _REGISTER_PROBE], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.split(maxsplit=2)[:2] == ["False", "True"]
    assert done.stdout.split(maxsplit=2)[2].strip() == str([[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]])
