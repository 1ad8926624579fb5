"""The routing and sum kernels of the benchmark's MoE drafter step (Triton, CUDA only).

With torch ops the router's softmax, top-k, renormalisation and casts are six launches, and
the expert sum, the gated shared expert and the residual four more. vLLM runs the first
group as one kernel (``topk_softmax``); these kernels do the same for the benchmark's step,
in both precisions (they read no weights):

* ``topk_softmax``: the router's top-k experts and their renormalised softmax weights, plus
  the shared expert's sigmoid gate when the logits carry it as one more column, in one launch;
* ``combine``: ``h + sum over top-k of the expert rows + gate * shared`` in one launch;
  ``combine_quant`` also writes the sum's rows in FP8 with one scale each, the next linear's
  prepared input.

Arithmetic is float32 and each output is rounded once.
"""

# Triton kernels are untyped by nature; the Python wrappers below are typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mtpconv.kernels import pdl
from mtpconv.kernels.triton_glue import ELEMENTS_PER_PROGRAM
from mtpconv.kernels.triton_quant import fp8_scaled
from mtpconv.kernels.triton_tile import pdl_enter


@triton.jit
def fp8_row(x):
    """A float32 row in FP8's range with one scale: ``(x / scale clamped, scale)``."""
    return fp8_scaled(x, tl.max(tl.abs(x), axis=0))


@triton.jit
def _topk_softmax_kernel(
    l_ptr,
    ids_ptr,
    w_ptr,
    g_ptr,
    E,
    stride_l,
    TOP_K: tl.constexpr,
    OUT_K: tl.constexpr,
    SLOTS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    GATE: tl.constexpr,
    APPEND: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_E)
    x = tl.load(l_ptr + row * stride_l + offs, mask=offs < E, other=float("-inf")).to(tl.float32)
    slots = tl.arange(0, SLOTS)
    picked = tl.full([SLOTS], float("-inf"), tl.float32)
    ids = tl.zeros([SLOTS], tl.int64)
    for i in tl.static_range(TOP_K):
        best = tl.max(x, axis=0)
        j = tl.min(tl.where(x == best, offs, BLOCK_E), axis=0)  # the first index holding it
        picked = tl.where(slots == i, best, picked)
        ids = tl.where(slots == i, j.to(tl.int64), ids)
        x = tl.where(offs == j, float("-inf"), x)
    # softmax over all experts, then renormalised over the top k: the full
    # denominator cancels, leaving a softmax over the k picked logits
    e = tl.where(slots < TOP_K, tl.exp(picked - tl.max(picked, axis=0)), 0.0)
    w = e / tl.sum(e, axis=0)
    if GATE:
        g = tl.load(l_ptr + row * stride_l + E).to(tl.float32)
        gate = 1.0 / (1.0 + tl.exp(-g))
        if APPEND:  # the shared expert as one more expert (index E) with weight sigmoid(gate)
            w = tl.where(slots == TOP_K, gate, w)
            ids = tl.where(slots == TOP_K, E, ids)
        else:
            tl.store(g_ptr + row, gate.to(g_ptr.dtype.element_ty))
    out = slots < OUT_K
    tl.store(ids_ptr + row * OUT_K + slots, ids, mask=out)
    tl.store(w_ptr + row * OUT_K + slots, w.to(w_ptr.dtype.element_ty), mask=out)


def topk_softmax(
    logits: torch.Tensor,
    top_k: int,
    n_experts: int,
    *,
    weight_dtype: torch.dtype,
    append_shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Top-k routing of ``logits`` ``[T, n_experts]`` or ``[T, n_experts + 1]``.

    Returns ``(ids, weights, gate)``: ``ids`` int64 ``[T, top_k]``, the experts of the
    largest logits in descending order (the first index among equals); ``weights`` the
    softmax over all experts renormalised over those k (as ``softmax``, ``topk`` and a
    division by the sum give), in ``weight_dtype``. A last column past ``n_experts`` is
    the shared expert's gate: ``gate`` ``[T, 1]`` = its sigmoid, or, with
    ``append_shared``, ``ids`` and ``weights`` get one more column (expert
    ``n_experts``, weight the sigmoid) and ``gate`` is None.
    """
    t, cols = logits.shape
    if cols not in (n_experts, n_experts + 1) or not 0 < top_k <= n_experts or logits.stride(1) != 1:
        raise ValueError(f"topk_softmax: logits {tuple(logits.shape)} for {n_experts} experts, top {top_k}")
    has_gate = cols == n_experts + 1
    if append_shared and not has_gate:
        raise ValueError("topk_softmax: append_shared needs the shared gate as the logits' last column")
    out_k = top_k + 1 if append_shared else top_k
    ids = torch.empty((t, out_k), dtype=torch.int64, device=logits.device)
    weights = torch.empty((t, out_k), dtype=weight_dtype, device=logits.device)
    gate = (
        torch.empty((t, 1), dtype=weight_dtype, device=logits.device)
        if has_gate and not append_shared
        else None
    )
    if t:
        _topk_softmax_kernel[(t,)](
            logits,
            ids,
            weights,
            gate if gate is not None else weights,
            n_experts,
            logits.stride(0),
            TOP_K=top_k,
            OUT_K=out_k,
            SLOTS=triton.next_power_of_2(out_k),
            BLOCK_E=triton.next_power_of_2(n_experts),
            GATE=has_gate,
            APPEND=append_shared,
            num_warps=4 if n_experts <= 1024 else 8,
            **pdl.producer_launch(logits.device),
        )
    return ids, weights, gate


@triton.jit
def _combine_kernel(
    h_ptr,
    p_ptr,
    s_ptr,
    g_ptr,
    o_ptr,
    q_ptr,
    qs_ptr,
    H,
    stride_h,
    stride_p,
    stride_s,
    stride_o,
    TOP_K: tl.constexpr,
    SHARED: tl.constexpr,
    BLOCK: tl.constexpr,
    QUANT: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < H
    acc = tl.load(h_ptr + row * stride_h + offs, mask=mask, other=0.0).to(tl.float32)
    for i in tl.static_range(TOP_K):
        acc += tl.load(p_ptr + (row * TOP_K + i) * stride_p + offs, mask=mask, other=0.0).to(tl.float32)
    if SHARED:
        g = tl.load(g_ptr + row).to(tl.float32)
        acc += g * tl.load(s_ptr + row * stride_s + offs, mask=mask, other=0.0).to(tl.float32)
    out = acc.to(o_ptr.dtype.element_ty)
    tl.store(o_ptr + row * stride_o + offs, out, mask=mask)
    if QUANT:  # the whole row is this program's: its FP8 copy with one scale (as quant_per_token)
        q, scale = fp8_row(out.to(tl.float32))
        tl.store(q_ptr + row * H + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(qs_ptr + row, scale)


def combine(
    h: torch.Tensor,
    expert_rows: torch.Tensor,
    shared: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """``h + expert_rows.view(T, k, H).sum(1) + gate * shared`` in one launch.

    ``h`` ``[T, H]``; ``expert_rows`` ``[T*k, H]`` (row ``t*k + i``: token t's i-th
    expert, routing weight already applied); ``shared`` ``[T, H]`` and ``gate``
    ``[T, 1]`` together or not at all. Returns ``[T, H]`` in h's dtype.
    """
    return _combine(h, expert_rows, shared, gate, quant=False)[0]


def combine_quant(
    h: torch.Tensor,
    expert_rows: torch.Tensor,
    shared: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`combine`, and its rows in FP8 with one scale each, as
    :func:`mtpconv.kernels.triton_quant.quant_per_token` gives them (the next linear's
    prepared input): ``(out, q [T, H], scale [T, 1])``, one launch."""
    out, q, s = _combine(h, expert_rows, shared, gate, quant=True)
    assert q is not None and s is not None
    return out, q, s


def _combine(
    h: torch.Tensor,
    expert_rows: torch.Tensor,
    shared: torch.Tensor | None,
    gate: torch.Tensor | None,
    quant: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    t, hidden = h.shape
    if (shared is None) != (gate is None):
        raise ValueError("combine: shared and gate come together")
    rows = expert_rows.shape[0]
    out = torch.empty_like(h)
    q = torch.empty((t, hidden), dtype=torch.float8_e4m3fn, device=h.device) if quant else None
    qs = torch.empty((t, 1), dtype=torch.float32, device=h.device) if quant else None
    if t == 0:
        return out, q, qs
    if rows % t or expert_rows.shape[1] != hidden or h.stride(1) != 1 or expert_rows.stride(1) != 1:
        raise ValueError(f"combine: h {tuple(h.shape)} and expert rows {tuple(expert_rows.shape)} do not fit")
    if shared is not None and gate is not None:
        if shared.shape != h.shape or shared.stride(1) != 1 or gate.numel() != t:
            raise ValueError(
                f"combine: shared {tuple(shared.shape)} / gate {tuple(gate.shape)} for h {tuple(h.shape)}"
            )
        gate = gate.reshape(t).contiguous()
    # quant: one program a row (its amax); else chunks of the row
    block = triton.next_power_of_2(hidden) if quant else ELEMENTS_PER_PROGRAM
    _combine_kernel[(t, triton.cdiv(hidden, block))](
        h,
        expert_rows,
        shared if shared is not None else h,
        gate if gate is not None else h,
        out,
        q if q is not None else out,
        qs if qs is not None else out,
        hidden,
        h.stride(0),
        expert_rows.stride(0),
        shared.stride(0) if shared is not None else 0,
        out.stride(0),
        TOP_K=rows // t,
        SHARED=shared is not None,
        BLOCK=block,
        QUANT=quant,
        num_warps=4 if block <= 2048 else 8,
        **pdl.producer_launch(h.device),
    )
    return out, q, qs
