"""Triton kernels for routed experts in the benchmark's drafter step (CUDA only; imported lazily).

The plugin hands routed experts to vLLM's own ``Fp8MoEMethod``; these are the step's, the
same for both precisions.


* ``moe_grouped``: one program per (output tile, hit expert) reads that
  expert's weight tile ONCE for all the tokens routed to it (up to 64 tokens
  per expert with ``tl.dot``); no sort and no host sync: at 2+ tokens each program
  finds whether it is its expert's first (token, expert) pair among all pairs and
  gathers the expert's tokens itself; at one token each pair serves itself
  (``pair_checks``: as at 2+ tokens). Optionally fuses SiLU(gate) * up into
  the load of the down projection's input and the routing weight into the
  epilogue, or SiLU(gate) * up into the gate/up projection's epilogue (``glu``).
  Weights ``[E, N, K]``: FP8 with one scale per expert, or BF16. FP8 experts also
  take FP8 activations with one scale per row (``x_scale``), which the MMA reads
  as they are. Where :mod:`mtpconv.kernels.pdl` says so (by default on Hopper
  with Triton 3.6+; ``MTPCONV_PDL``) it is launched with programmatic dependent launch and
  waits for the previous kernel first.
* ``moe_projection`` / ``routed_experts``: one projection / a MoE layer's two; with
  ``split`` (the layer's default at 2+ tokens) a small launch of its own prepares each
  projection's input first (per-token FP8 quantization, SiLU * up); at one token the
  gate/up projection writes SiLU * up (``glu``).
* ``wo_moe`` (:mod:`benchmarks.kernels.moe_pairs`): one GEMV per (token, expert)
  pair, the measured baseline; ``moe_grouped`` falls back to it beyond
  ``GROUPED_MAX_TOKENS`` tokens.
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from benchmarks.kernels.moe_pairs import wo_moe
from benchmarks.kernels.moe_tuned import DOT as DOT
from benchmarks.kernels.moe_tuned import DOT_FP8 as DOT_FP8
from benchmarks.kernels.moe_tuned import FMA as FMA
from benchmarks.kernels.moe_tuned import FMA_NARROW as FMA_NARROW
from benchmarks.kernels.moe_tuned import default_config as default_config
from mtpconv.kernels import pdl as pdl_setting
from mtpconv.kernels.triton_quant import FP8_MAX
from mtpconv.kernels.triton_tile import pdl_enter, pdl_leave


@triton.jit
def _moe_grouped_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    ids_ptr,
    rw_ptr,
    xs_ptr,
    o_ptr,
    N,
    K,
    TOPK,
    PAIRS,
    stride_xm,
    stride_we,
    stride_wn,
    stride_om,
    X_PER_PAIR: tl.constexpr,
    ACT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_RW: tl.constexpr,
    PAIRS_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT: tl.constexpr,
    FP8_MMA: tl.constexpr,
    PDL: tl.constexpr,
    NARROW: tl.constexpr,
    X_SCALE: tl.constexpr,
    GLU: tl.constexpr,
    ONE_TOKEN: tl.constexpr,
):
    # DOT=False (one token per expert at most, BLOCK_M == 1): FMA on CUDA cores with a
    # 2-D accumulator reduced once at the end, as the skinny GEMM does at one token.
    # FP8_MMA: FP8 weights meet FP8 activations in the MMA, each token's K tile
    # quantized here with its own scale (as the skinny GEMM's MMA == 2), instead of
    # widening every weight tile to the activation dtype. NARROW (FMA only): 8-byte weight
    # loads whose layout is the activation row's, each thread summing its own 8 products
    # (as the skinny GEMM's Config.narrow). X_SCALE: x is FP8 already, one scale per row
    # (xs_ptr, applied in the epilogue), so the MMA takes it as it is and accumulates in place.
    # GLU: the experts are [gate; up] (N = 2I): a tile holds BLOCK_N // 2 gate rows and the
    # up rows of the same columns, interleaved, and the output is SiLU(gate) * up ([pairs, I]).
    # ONE_TOKEN: the launch has one token, so no other pair shares this pair's expert: it
    # serves itself, without reading the other pairs' ids (the routing checks).
    pid_n = tl.program_id(0)
    pair = tl.program_id(1)
    pdl_enter(PDL)  # the ids and activations may come from the previous kernel
    expert = tl.load(ids_ptr + pair)
    if ONE_TOKEN:  # each pair is its own token's only pair with its expert: it serves itself
        earlier = 0
        slot_pair = tl.full((BLOCK_M,), pair, tl.int32)
        valid = tl.full((BLOCK_M,), 1, tl.int1)
    else:
        offs_p = tl.arange(0, PAIRS_PAD)
        all_ids = tl.load(ids_ptr + offs_p, mask=offs_p < PAIRS, other=-1)
        same = all_ids == expert
        earlier = tl.sum((same & (offs_p < pair)).to(tl.int32), axis=0)
    if earlier == 0:  # this pair is its expert's first: it serves all of the expert's tokens
        if not ONE_TOKEN:
            pos = tl.cumsum(same.to(tl.int32), axis=0) - 1
            slots = tl.arange(0, BLOCK_M)
            hit = same[None, :] & (pos[None, :] == slots[:, None])
            slot_pair = tl.sum(tl.where(hit, offs_p[None, :], 0), axis=1)
            valid = slots < tl.sum(same.to(tl.int32), axis=0)
        if X_PER_PAIR:  # noqa: SIM108 - constexpr branch, kept as a statement for Triton
            rows = slot_pair
        else:
            rows = slot_pair // TOPK
        if GLU:  # even r: gate row of column pid_n * BLOCK_N // 2 + r // 2; odd r: its up row
            r = tl.arange(0, BLOCK_N)
            cols = pid_n * (BLOCK_N // 2) + r // 2
            offs_n = cols + (r % 2) * (N // 2)
            mask_n = cols < N // 2
        else:
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mask_n = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        if NARROW:
            offs_k = tl.max_contiguous(tl.multiple_of(offs_k, 8), 8)
        w_ptrs = w_ptr + expert.to(tl.int64) * stride_we + offs_n[:, None] * stride_wn + offs_k[None, :]
        if NARROW:  # one row (BLOCK_M == 1), read as a vector in the weight tile's layout
            x_ptrs = x_ptr + tl.sum(rows, axis=0) * stride_xm + offs_k
            acc2 = tl.zeros((BLOCK_N, BLOCK_K // 8), dtype=tl.float32)
        else:
            x_ptrs = x_ptr + rows[None, :] * stride_xm + offs_k[:, None]
        if DOT:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        elif not NARROW:
            acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0, eviction_policy="evict_first")
                xmask = valid[None, :]
            else:
                mask_k = (k0 + offs_k) < K
                w = tl.load(
                    w_ptrs, mask=mask_n[:, None] & mask_k[None, :], other=0.0, eviction_policy="evict_first"
                )
                xmask = valid[None, :] & mask_k[:, None]
            if NARROW:
                if EVEN_K:
                    g = tl.load(x_ptrs).to(tl.float32)
                    if ACT:
                        u = tl.load(x_ptrs + K).to(tl.float32)
                else:
                    g = tl.load(x_ptrs, mask=mask_k, other=0.0).to(tl.float32)
                    if ACT:
                        u = tl.load(x_ptrs + K, mask=mask_k, other=0.0).to(tl.float32)
                if ACT:  # rounded to the activation dtype, as the other modes feed it
                    g = (g / (1.0 + tl.exp(-g)) * u).to(x_ptr.dtype.element_ty).to(tl.float32)
                prod = w.to(tl.float32) * g[None, :]
                acc2 += tl.sum(tl.reshape(prod, (BLOCK_N, BLOCK_K // 8, 8)), axis=2)
            elif ACT:  # the input holds [gate | up]: feed SiLU(gate) * up
                g = tl.load(x_ptrs, mask=xmask, other=0.0).to(tl.float32)
                u = tl.load(x_ptrs + K, mask=xmask, other=0.0).to(tl.float32)
                xt = (g / (1.0 + tl.exp(-g)) * u).to(x_ptr.dtype.element_ty)
            else:
                xt = tl.load(x_ptrs, mask=xmask, other=0.0)
            if FP8_MMA:
                xf = xt.to(tl.float32)
                amax = tl.maximum(tl.max(tl.abs(xf), axis=0), 1e-30)
                q = (xf * (FP8_MAX / amax)[None, :]).to(tl.float8e4nv)
                acc += tl.dot(w, q) * (amax / FP8_MAX)[None, :]
            elif DOT:
                acc = tl.dot(w.to(xt.dtype), xt, acc)
            elif not NARROW:
                acc2 += w.to(tl.float32) * tl.reshape(xt.to(tl.float32), (1, BLOCK_K))
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        pdl_leave(PDL)
        if not DOT:
            acc = tl.reshape(tl.sum(acc2, axis=1), (BLOCK_N, 1))
        if HAS_SCALE:
            acc = acc * tl.load(s_ptr + expert)
        if X_SCALE:
            acc = acc * tl.load(xs_ptr + rows, mask=valid, other=0.0)[None, :]
        if HAS_RW:
            acc = acc * tl.load(rw_ptr + slot_pair, mask=valid, other=0.0).to(tl.float32)[None, :]
        if GLU:
            gate, up = tl.split(tl.permute(tl.reshape(acc, (BLOCK_N // 2, 2, BLOCK_M)), (0, 2, 1)))
            half = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            o_ptrs = o_ptr + slot_pair[None, :] * stride_om + half[:, None]
            act = gate / (1.0 + tl.exp(-gate)) * up
            tl.store(o_ptrs, act.to(o_ptr.dtype.element_ty), mask=(half < N // 2)[:, None] & valid[None, :])
        else:
            o_ptrs = o_ptr + slot_pair[None, :] * stride_om + offs_n[:, None]
            tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=mask_n[:, None] & valid[None, :])


GROUPED_MAX_TOKENS = 64  # tokens per launch the grouped kernel takes (one tile of tl.dot)


def moe_grouped(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor | None,
    topk_ids: torch.Tensor,
    *,
    x_per_pair: bool,
    act: bool = False,
    route_w: torch.Tensor | None = None,
    config: tuple[int, int, int, int, int] | None = None,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    glu: bool = False,
    pair_checks: bool = False,
) -> torch.Tensor:
    """Routed experts, each hit expert read once: output ``[T*topk, N]`` (row = pair).

    Row ``p`` = ``f(x_row) @ W[ids[p]].T * s[ids[p]] * route_w[p]``, with x_row
    ``x[p // topk]`` (or ``x[p]`` when ``x_per_pair``) and ``f`` SiLU(gate) * up
    of a ``[.., 2K]`` row when ``act``, else the identity. ``topk_ids`` ``[T, topk]``
    (each token names an expert at most once, as top-k gives); ``route_w``
    ``[T, topk]`` or None. ``config``: ``(BLOCK_N, BLOCK_K, warps, stages, mode)``,
    mode ``FMA`` or ``FMA_NARROW`` (one token only; more run as ``DOT``), ``DOT`` (MMA in the activation
    dtype, weight-only numerics) or ``DOT_FP8`` (FP8 weights only: MMA in FP8 with
    each token's K tile quantized in registers, W8A8 numerics). ``x_scale`` ``[rows]`` or
    ``[rows, 1]`` float32: ``x`` is FP8 already (``quant_per_token``; ``act`` then False, the
    down projection's SiLU * up applied by the quantization), each row ``x * x_scale``; the
    MMA takes FP8 weights and activations as they are and accumulates in place. The output
    is ``out_dtype``, by default x's dtype (BF16 for FP8 activations). ``glu``: the experts
    are ``[gate; up]`` (``N = 2I``) and the output is ``SiLU(gate) * up``, ``[T*topk, I]``,
    from the float32 sums, rounded once (no ``act`` or ``route_w`` with it). ``pair_checks``:
    a one-token launch checks the other pairs too, as 2+ tokens do (the kernel until the
    eighteenth session), where by default each pair serves itself.
    """
    ids = topk_ids.reshape(-1)
    t, topk = topk_ids.shape
    pairs = ids.numel()
    _, n, k = w.shape
    width = 2 * k if act else k
    if x.shape[-1] != width or x.stride(-1) != 1:
        raise ValueError(f"moe_grouped: x {tuple(x.shape)} does not fit experts {tuple(w.shape)}")
    fp8_x = x_scale is not None
    if fp8_x and (x.dtype != torch.float8_e4m3fn or w.dtype != torch.float8_e4m3fn or act):
        raise ValueError(
            f"moe_grouped: x_scale takes FP8 activations ({x.dtype}) for FP8 experts ({w.dtype}), "
            "their SiLU * up already applied"
        )
    if fp8_x and t > GROUPED_MAX_TOKENS:
        raise ValueError(f"moe_grouped: FP8 activations take at most {GROUPED_MAX_TOKENS} tokens, got {t}")
    if glu and (act or route_w is not None or n % 2):
        raise ValueError(f"moe_grouped: glu takes [gate; up] experts of even N ({n}), no act or route_w")
    if t > GROUPED_MAX_TOKENS:
        xin = x
        if act:
            g, u = x.chunk(2, dim=-1)
            xin = (torch.nn.functional.silu(g) * u).contiguous()
        y = wo_moe(xin, w, w_scale, topk_ids, x_per_pair=x_per_pair)
        if glu:
            g, u = y.float().chunk(2, dim=-1)
            return (torch.nn.functional.silu(g) * u).to(y.dtype)
        return y if route_w is None else y * route_w.reshape(-1, 1).to(y.dtype)
    if out_dtype is None:
        out_dtype = torch.bfloat16 if fp8_x else x.dtype
    out = torch.empty((pairs, n // 2 if glu else n), dtype=out_dtype, device=x.device)
    block_n, block_k, warps, stages, mode = (
        config if config is not None else default_config(t, n, k, w.dtype == torch.float8_e4m3fn, act, fp8_x)
    )
    if mode == DOT_FP8 and w.dtype != torch.float8_e4m3fn:
        raise ValueError(f"moe_grouped: the FP8 MMA needs FP8 experts, got {w.dtype}")
    if mode == DOT_FP8 and fp8_x:
        raise ValueError("moe_grouped: FP8 activations need no quantization in registers: take DOT")
    dot = mode not in (FMA, FMA_NARROW) or t > 1
    block_m = max(16, triton.next_power_of_2(t)) if dot else 1
    rw = route_w.reshape(-1).contiguous() if route_w is not None else ids
    grid = (triton.cdiv(n, block_n), pairs)
    _moe_grouped_kernel[grid](
        x,
        w,
        w_scale if w_scale is not None else ids,
        ids,
        rw,
        x_scale.reshape(-1) if x_scale is not None else rw,
        out,
        n,
        k,
        topk,
        pairs,
        x.stride(0),
        w.stride(0),
        w.stride(1),
        out.stride(0),
        X_PER_PAIR=x_per_pair,
        ACT=act,
        HAS_SCALE=w_scale is not None,
        HAS_RW=route_w is not None,
        PAIRS_PAD=triton.next_power_of_2(pairs),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EVEN_K=k % block_k == 0,
        DOT=dot,
        FP8_MMA=mode == DOT_FP8,
        NARROW=mode == FMA_NARROW and not dot,
        X_SCALE=fp8_x,
        GLU=glu,
        ONE_TOKEN=t == 1 and not pair_checks,
        num_warps=warps,
        num_stages=stages,
        **pdl_setting.launch(x.device),
    )
    return out


def moe_projection(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor | None,
    topk_ids: torch.Tensor,
    *,
    x_per_pair: bool,
    act: bool = False,
    route_w: torch.Tensor | None = None,
    split: bool = False,
    config: tuple[int, int, int, int, int] | None = None,
) -> torch.Tensor:
    """One projection of routed experts, as :func:`moe_grouped` (arguments alike). ``split``:
    a small launch of its own prepares ``x`` first, so that the grouped kernel's K loop
    only loads and multiplies: FP8 experts at 2+ tokens take ``x`` quantized per token
    (``quant_per_token``, SiLU * up applied there with ``act``; the MMA in FP8, scales in
    the epilogue); otherwise SiLU * up comes from ``triton_glue.silu_mul`` (nothing to
    prepare without ``act``). Without it the grouped kernel applies SiLU * up itself and
    FP8 experts quantize each token's K tile in registers."""
    if split and w.dtype == torch.float8_e4m3fn and topk_ids.shape[0] > 1:
        from benchmarks.kernels.producers import quant_act, quant_per_token

        q, s = quant_act(x) if act else quant_per_token(x)
        return moe_grouped(
            q, w, w_scale, topk_ids, x_per_pair=x_per_pair, route_w=route_w, config=config,
            x_scale=s, out_dtype=x.dtype,
        )  # fmt: skip
    if split and act:
        from mtpconv.kernels.triton_glue import silu_mul

        x, act = silu_mul(x), False
    return moe_grouped(
        x, w, w_scale, topk_ids, x_per_pair=x_per_pair, act=act, route_w=route_w, config=config
    )


def routed_experts(
    h: torch.Tensor,
    gate_up: tuple[torch.Tensor, torch.Tensor | None],
    down: tuple[torch.Tensor, torch.Tensor | None],
    topk_ids: torch.Tensor,
    route_w: torch.Tensor | None,
    *,
    split: bool | None = None,
    h_fp8: tuple[torch.Tensor, torch.Tensor] | None = None,
    glu: bool | None = None,
) -> torch.Tensor:
    """A MoE layer's routed experts, ``[T*topk, H]``, one row per (token, expert) pair with
    its routing weight applied: ``gate_up`` and ``down`` are ``(weights [E, N, K], scale
    [E] or None)``, both FP8 or both BF16. ``h_fp8``: ``h``'s rows in FP8 with one scale each,
    as :func:`mtpconv.kernels.triton_quant.quant_per_token` gives them, from the launch that
    wrote ``h`` (FP8 experts with ``split``: the gate/up projection reads them instead of
    quantizing ``h`` itself). ``glu`` (the default at one token; without ``split`` only):
    the gate/up projection writes SiLU(gate) * up itself (``moe_grouped(glu=True)``), so the
    down projection reads it as it is, where otherwise each of its programs recomputes it
    from gate and up.
    Measured in the drafter step on the H200 (``--variants
    bf16,bf16+noglu,auto,auto+noglu``, fifteenth session, two runs): 397B at one token
    236.8 / 237.2 us against 243.2 / 242.8 with BF16 experts, 132.1 / 132.4 against 133.6 /
    132.2 with FP8 ones; Next-80B within 0.6 us either way.

    ``split`` (the default at 2 to ``GROUPED_MAX_TOKENS`` tokens): each projection's input
    prepared by a launch of its own (:func:`moe_projection`): FP8 experts take it quantized
    per token, with SiLU * up for the down projection; BF16 experts take SiLU * up from
    ``triton_glue.silu_mul``. Measured on the H200 (docs/BENCHMARKS.md, ninth session,
    397B and Next-80B experts at 4 and 16 tokens): split was 1-20% faster per projection in
    FP8 and 5-9% on the BF16 down projections, the launch it adds included; at one token
    preparing SiLU * up alone won nothing."""
    t = topk_ids.shape[0]
    fp8 = gate_up[0].dtype == torch.float8_e4m3fn
    if fp8 != (down[0].dtype == torch.float8_e4m3fn):
        raise ValueError(f"routed_experts: gate_up {gate_up[0].dtype} and down {down[0].dtype} differ")
    if split is None:
        split = 1 < t <= GROUPED_MAX_TOKENS
    if glu is None:
        glu = t == 1
    if glu and not split:
        y = moe_grouped(h, *gate_up, topk_ids, x_per_pair=False, glu=True)
        return moe_grouped(y, *down, topk_ids, x_per_pair=True, route_w=route_w)
    if h_fp8 is not None and split and fp8:
        q, s = h_fp8
        if q.shape != h.shape or s.numel() != t:
            raise ValueError(
                f"routed_experts: h_fp8 {tuple(q.shape)} / {tuple(s.shape)} for h {tuple(h.shape)}"
            )
        y = moe_grouped(q, *gate_up, topk_ids, x_per_pair=False, x_scale=s, out_dtype=h.dtype)
    else:
        y = moe_projection(h, *gate_up, topk_ids, x_per_pair=False, split=split)
    return moe_projection(y, *down, topk_ids, x_per_pair=True, act=True, route_w=route_w, split=split)
