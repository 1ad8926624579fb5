"""CUDA tests: programmatic dependent launch (mtpconv.kernels.pdl) keeps every result.

With PDL a kernel starts before its predecessor ends and waits for it before reading
activations, so the checks are: the same bytes as without PDL (the arithmetic does not
change), the dequantized reference within the stated tolerances, and chains of
dependent kernels (each reading what the one before wrote, split-K workspaces shared
between them, a torch kernel in between; the step's producers, which take PDL too)
captured in a CUDA graph and replayed with new inputs. Skipped without a Hopper-or-newer GPU and Triton.
"""

from __future__ import annotations

import pytest
import torch

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.kernels import pdl, reference, triton_available
from tests.helpers import rel_error
from tests.kernels.graph_replay import replays_match_eager

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available()
        or torch.cuda.get_device_capability() < (9, 0)
        or not triton_available(),
        reason="needs a Hopper-or-newer CUDA device and triton",
    ),
]
DEV = torch.device("cuda")
MODES = ["early", "late"]


def _weight(n: int, k: int, layout: str, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    q = quantize_fp8(torch.randn(n, k, generator=g) * 0.05)
    if layout == "block":
        s = torch.rand(-(-n // 128), -(-k // 128), generator=g) * 1e-3 + 1e-4
    elif layout == "row":
        s = torch.rand(n, generator=g) * 1e-3 + 1e-4
    else:
        s = q.scale
    return q.weight.to(DEV), s.to(DEV)


def _ref(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    full = reference.expand_block_scale(s, n, k) if reference.is_block_scale(s, n, k) else s.reshape(-1, 1)
    return x.double() @ (w.double() * full.double()).t()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 5120, 6144), (4, 2048, 8192), (16, 333, 1040), (3, 256, 200)])
@pytest.mark.parametrize("layout", ["tensor", "row", "block"])
def test_skinny_with_pdl_is_bit_identical_and_matches_reference(
    mode: str, m: int, n: int, k: int, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tolerance as the skinny tests: rel. L2 < 1e-2 at one token (weight-only), < 6e-2
    at 2+ (FP8 MMA); split-K on and off; PDL changes no bit of the output."""
    from mtpconv.kernels import triton_skinny as ts

    g = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(DEV)
    w, s = _weight(n, k, layout, g)
    ref = _ref(x, w, s)
    base = ts.default_config(m, n, k, ts.sm_count(0))
    for programs in (1, 1 << 20):
        cfg = base._replace(programs=programs)
        monkeypatch.setenv(pdl.ENV, "0")
        plain = ts.skinny_linear(x, w, s, config=cfg)
        monkeypatch.setenv(pdl.ENV, mode)
        assert pdl.setting(DEV) is not pdl.Pdl.OFF
        y = ts.skinny_linear(x, w, s, config=cfg)
        assert torch.equal(y, plain), (mode, cfg)
        assert rel_error(y, ref) < (1e-2 if m == 1 else 6e-2)


def _chain(x: torch.Tensor, ws: list[tuple[torch.Tensor, torch.Tensor]], moe: tuple) -> list[torch.Tensor]:
    """Dependent kernels: each linear reads the previous output (split-K forced on the
    big ones, so they share the per-stream workspace), a torch op in between, then the
    grouped MoE kernel on ids from torch's top-k, and its down projection."""
    from benchmarks.kernels import moe as triton_moe
    from mtpconv.kernels import triton_skinny as ts

    outs = []
    h = x
    for i, (w, s) in enumerate(ws):
        n, k = w.shape
        cfg = ts.default_config(h.shape[0], n, k, ts.sm_count(0))._replace(programs=1 << 20)
        h = ts.skinny_linear(h, w, s, config=cfg)
        if i == 1:
            h = h * 0.5 + 1.0  # a kernel that is not ours
        outs.append(h)
    router, gu, gu_s, dn, dn_s = moe
    ids = torch.topk(h.float() @ router.t(), 4, dim=-1).indices
    y = triton_moe.moe_grouped(h, gu, gu_s, ids, x_per_pair=False)
    outs += [y, triton_moe.moe_grouped(y, dn, dn_s, ids, x_per_pair=True, act=True)]
    return outs


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tokens", [1, 4])
def test_dependent_chain_in_cuda_graph_with_pdl(
    mode: str, tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A captured chain with PDL replays to the bytes of the same chain run eagerly
    without PDL, for fresh inputs each replay (a missing wait would read stale data)."""
    g = torch.Generator().manual_seed(tokens)
    dims = [(4096, 2048), (8192, 4096), (2048, 8192), (1024, 2048)]
    ws = [_weight(n, k, "tensor", g) for n, k in dims]
    e = 16
    router = torch.randn(e, 1024, generator=g).to(DEV)
    gu = quantize_fp8(torch.randn(e, 512, 1024, generator=g) * 0.05)
    dn = quantize_fp8(torch.randn(e, 1024, 256, generator=g) * 0.05)
    moe = (router, gu.weight.to(DEV), gu.scale.to(DEV), dn.weight.to(DEV), dn.scale.to(DEV))
    x = torch.randn(tokens, 2048, generator=g).to(torch.bfloat16).to(DEV)

    def chain() -> list[torch.Tensor]:
        return _chain(x, ws, moe)

    def refresh() -> None:
        x.copy_(torch.randn(tokens, 2048, generator=g).to(torch.bfloat16))

    replays_match_eager(chain, chain, refresh, mode, monkeypatch)


def _producer_chain(
    emb: torch.Tensor, hid: torch.Tensor, ws: list[tuple[torch.Tensor, torch.Tensor]]
) -> list:
    """The step's producers between linears, each reading what the one before wrote: the
    concatenation's FP8 rows, a residual add with its rows (split across programs that
    agree on the amax: 10240 columns), SiLU * up's rows, the per-tensor add before a
    cuBLAS linear, SiLU * up alone, routing and the MoE sum with its rows."""
    from benchmarks.kernels import glue, producers
    from benchmarks.kernels.prepared import prepared_linear
    from mtpconv.kernels.triton_glue import silu_mul

    def lin(rows: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
        return prepared_linear(rows[0], *ws[i], None, x_scale=rows[1], out_dtype=torch.bfloat16)

    h = lin(producers.quant_cat(emb, hid), 0)  # [T, 10240]
    total, q, sc = producers.add_quant(h, h * 0.25)
    up = lin((q, sc), 1)  # [T, 2 * 2048]
    d = lin(producers.quant_act(up), 2)  # [T, 2048]
    total2, qt, st = producers.add_quant_tensor(d, emb[:, :2048])
    c = prepared_linear(qt, *ws[3], None, x_scale=st, out_dtype=torch.bfloat16)  # [T, 4096], 0-d scale
    act = silu_mul(c)  # [T, 2048]
    ids, weights, gate = glue.topk_softmax(act[:, :17], 4, 16, weight_dtype=act.dtype)
    rows = (act.repeat_interleave(4, dim=0) * weights.reshape(-1, 1)).contiguous()
    assert gate is not None
    out, q2, s2 = glue.combine_quant(act, rows, d, gate)
    return [h, total, q, sc, up, d, total2, qt, st, c, act, ids, weights, out, q2, s2, lin((q2, s2), 4)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_producer_chain_in_cuda_graph_with_pdl(
    mode: str, tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producers and the skinny GEMM on their FP8 rows, captured with PDL, replay to the
    bytes of the same chain run eagerly without PDL, for fresh inputs each replay."""
    g = torch.Generator().manual_seed(100 + tokens)
    dims = [(10240, 4096), (4096, 10240), (2048, 2048), (4096, 2048), (3000, 2048)]
    ws = [_weight(n, k, "row" if i % 2 else "tensor", g) for i, (n, k) in enumerate(dims)]
    emb = torch.randn(tokens, 2048, generator=g).to(torch.bfloat16).to(DEV)
    hid = torch.randn(tokens, 2048, generator=g).to(torch.bfloat16).to(DEV)

    def chain() -> list[torch.Tensor]:
        return _producer_chain(emb, hid, ws)

    def refresh() -> None:
        emb.copy_(torch.randn(tokens, 2048, generator=g).to(torch.bfloat16))
        hid.copy_(torch.randn(tokens, 2048, generator=g).to(torch.bfloat16) * 100)

    replays_match_eager(chain, chain, refresh, mode, monkeypatch)


def _both_paths(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, cfg: object, prep: object) -> list:
    """The skinny GEMM on BF16 rows (``cfg``), and on their FP8 rows from our per-token
    quantization (``prep``)."""
    from mtpconv.kernels import triton_quant
    from mtpconv.kernels import triton_skinny as ts

    q, qs = triton_quant.quant_per_token(x)
    yq = ts.skinny_linear(q, w, s, config=prep, x_scale=qs, out_dtype=torch.bfloat16)  # type: ignore[arg-type]
    return [ts.skinny_linear(x, w, s, config=cfg), yq]  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m", [1, 4, 16])
def test_linear_sees_the_rows_written_just_before_it(
    mode: str, m: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels write a linear's activations just before it (in a graph, with PDL: a torch
    copy, then our per-token quantization, which lets its dependents launch at once): the
    linear sees this replay's values, for every path its configurations take (FMA, GEMV,
    MMA on BF16 rows and on prepared FP8 rows, TMA, split-K, block scales)."""
    from mtpconv.kernels import triton_skinny as ts

    g = torch.Generator().manual_seed(m)
    n, k = 1536, 4096
    x = torch.zeros(m, k, dtype=torch.bfloat16, device=DEV)
    src = torch.zeros(m, k, dtype=torch.bfloat16, device=DEV)
    sms = ts.sm_count(0)
    cfgs = [ts.default_config(m, n, k, sms), ts.Config(False, 8, 512, 4, 3, 4 * sms)]
    if m > 1:
        cfgs += [
            ts.Config(True, 64, 128, 4, 3, 4 * sms, 2, tma=True),
            ts.Config(True, 64, 256, 4, 3, 2 * sms, 2),
        ]
    for layout in ("tensor", "block"):
        w, s = _weight(n, k, layout, g)
        for cfg in cfgs:
            for programs in (1, 1 << 20):
                c = cfg._replace(programs=programs)
                prep = ts.prepared_config(m, n, k, sms)._replace(programs=programs)

                def capture(
                    w: torch.Tensor = w, s: torch.Tensor = s, c: object = c, prep: object = prep
                ) -> list:
                    x.copy_(src)
                    return _both_paths(x, w, s, c, prep)

                def eager(
                    w: torch.Tensor = w, s: torch.Tensor = s, c: object = c, prep: object = prep
                ) -> list:
                    return _both_paths(src, w, s, c, prep)

                def refresh() -> None:
                    src.copy_(torch.randn(m, k, generator=g).to(torch.bfloat16))

                replays_match_eager(capture, eager, refresh, mode, monkeypatch, replays=2)


def test_late_by_default_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """On this device (Hopper, Triton and CUDA recent enough) unset means ``late``."""
    monkeypatch.delenv(pdl.ENV, raising=False)
    assert pdl.default_on()
    assert pdl.setting(DEV) is pdl.Pdl.LATE
