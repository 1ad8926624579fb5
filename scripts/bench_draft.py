"""Drafter-step microbenchmark at real model shapes (CUDA): BF16 vs FP8 paths.

One drafter step = ``mtp.fc`` + one MTP decoder layer's linears (fused qkv as
vLLM builds it, o, dense MLP or MoE router + routed experts + shared expert, the
shared expert inside the routed experts' grouped launches unless ``+noshared``)
+ the draft head (full vocabulary or 32,768 rows). Attention math, norms and
rotary are left out: they are the same in every variant and do not touch the
weights. Weights are random (std 0.02) and quantized with the tool's own
``mtpconv.formats.fp8.quantize_fp8``. Every variant's routed experts are those the BF16
step picks for the same weights and tokens (:func:`bf16_routing`; ``+ownroute``: its own),
so that the precisions compared read the same experts. Each variant is captured in a CUDA graph
(several weight sets per graph so that nothing stays in L2) and timed over
replays; the median is reported with the bytes the step must read and the
achieved bandwidth against a measured device-to-device copy.

Usage (repo root, CUDA machine)::

    PYTHONPATH=. python scripts/bench_draft.py --out OUTDIR [--micro]

Writes OUTDIR/bench_draft.json and OUTDIR/bench_draft.md; prints the tables.
A variant is an FP8 path, ``auto`` (each linear on the path ``fp8_linear`` picks for
it) or ``bf16``, optionally with modifiers (``wo_skinny+late``, ``bf16+noshared``): see
:func:`variant_parts`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from mtpconv.formats.fp8 import quantize_fp8
from mtpconv.kernels import (
    Fp8Path,
    Prepared,
    fp8_linear,
    fp8_mlp,
    pdl,
    run_path,
    takes_prepared,
    triton_available,
)

DRAFT_VOCAB = 32_768
L2_SAFE_BYTES = 400 * 2**20  # a graph reads at least this much before repeating a weight
ROUTER_ROW_ALIGN = 8  # rows of the router + shared-gate GEMM: a multiple of this (bf16: 16 bytes)


@dataclass(frozen=True)
class Shape:
    """Drafter shapes of one model (values from the models' config.json)."""

    name: str
    hidden: int
    vocab: int
    q_out: int  # q_proj rows (2 x heads x head_dim: Qwen3.5/Next gate the attention output)
    kv_out: int  # rows of k_proj and of v_proj each
    o_in: int
    intermediate: int = 0  # dense MLP
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0


SHAPES = {
    # Qwen3.5-27B: hidden 5120, 24 q heads x 256 (x2 gate), 4 kv heads x 256.
    "qwen3.5-27b": Shape("Qwen3.5-27B", 5120, 248_320, 12288, 1024, 6144, intermediate=17408),
    # Qwen3.5-397B-A17B: hidden 4096, 32 q heads / 2 kv heads x 256, 512 experts top-10,
    # moe_intermediate 1024, shared expert 1024.
    "qwen3.5-397b-a17b": Shape(
        "Qwen3.5-397B-A17B",
        4096,
        248_320,
        16384,
        512,
        8192,
        experts=512,
        top_k=10,
        moe_intermediate=1024,
        shared_intermediate=1024,
    ),
    # Qwen3-Next-80B-A3B: hidden 2048, 16 q heads / 2 kv heads x 256, 512 experts top-10,
    # moe_intermediate 512, shared expert 512, vocab 151,936.
    "qwen3-next-80b-a3b": Shape(
        "Qwen3-Next-80B-A3B",
        2048,
        151_936,
        8192,
        512,
        4096,
        experts=512,
        top_k=10,
        moe_intermediate=512,
        shared_intermediate=512,
    ),
}


@dataclass
class Linear:
    """One weight in BF16 and FP8 (quantized by the tool's own function)."""

    bf16: torch.Tensor
    fp8: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def make(cls, out_f: int, in_f: int, dev: torch.device, gen: torch.Generator) -> Linear:
        w = (torch.randn(out_f, in_f, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
        q = quantize_fp8(w)
        return cls(w, q.weight, q.scale)


@dataclass
class Experts:
    bf16: torch.Tensor  # [E, N, K]
    fp8: torch.Tensor
    scale: torch.Tensor  # [E]

    @classmethod
    def make(cls, e: int, out_f: int, in_f: int, dev: torch.device, gen: torch.Generator) -> Experts:
        w = torch.empty(e, out_f, in_f, device=dev, dtype=torch.bfloat16)
        q = torch.empty(e, out_f, in_f, device=dev, dtype=torch.float8_e4m3fn)
        s = torch.empty(e, device=dev, dtype=torch.float32)
        chunk = 32  # bounds the float32 temporaries of quantize_fp8
        for i in range(0, e, chunk):
            part = torch.randn(min(chunk, e - i), out_f, in_f, device=dev, generator=gen) * 0.02
            w[i : i + chunk] = part.to(torch.bfloat16)
            qq = quantize_fp8(w[i : i + chunk])
            q[i : i + chunk] = qq.weight
            s[i : i + chunk] = qq.scale
        return cls(w, q, s)


@dataclass
class WeightSet:
    fc: Linear
    qkv: Linear
    o: Linear
    head_full: Linear
    head_draft: Linear
    gate_up: Linear | None = None
    down: Linear | None = None
    router: torch.Tensor | None = None
    shared_gate_up: Linear | None = None
    shared_down: Linear | None = None
    shared_gate: torch.Tensor | None = None
    # [router; shared_gate; zero rows to a multiple of 8]: one launch for both. The zero
    # rows keep the logits' rows 16-byte aligned: with E + 1 = 513 rows cuBLAS took an
    # sm75 split-K kernel at 4 tokens (12.1 + 2.6 us on 397B; docs/BENCHMARKS.md, eighth
    # session). vLLM runs the router (E rows, aligned) and the shared gate apart.
    router_shared: torch.Tensor | None = None
    experts_gate_up: Experts | None = None
    experts_down: Experts | None = None


def build_weights(s: Shape, dev: torch.device, seed: int, head_full: Linear | None) -> WeightSet:
    gen = torch.Generator(device=dev).manual_seed(seed)
    h = s.hidden
    full = head_full if head_full is not None else Linear.make(s.vocab, h, dev, gen)
    # The draft head is rows of the full head, as build-draft-vocab writes it.
    ids = torch.randperm(s.vocab, device=dev, generator=gen)[:DRAFT_VOCAB].sort().values
    draft_bf16 = full.bf16[ids].contiguous()
    dq = quantize_fp8(draft_bf16)
    ws = WeightSet(
        fc=Linear.make(h, 2 * h, dev, gen),
        qkv=Linear.make(s.q_out + 2 * s.kv_out, h, dev, gen),
        o=Linear.make(h, s.o_in, dev, gen),
        head_full=full,
        head_draft=Linear(draft_bf16, dq.weight, dq.scale),
    )
    if s.experts == 0:
        ws.gate_up = Linear.make(2 * s.intermediate, h, dev, gen)
        ws.down = Linear.make(h, s.intermediate, dev, gen)
    else:
        assert s.shared_intermediate == s.moe_intermediate  # true of the benchmarked models
        ws.router = (torch.randn(s.experts, h, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
        ws.shared_gate = (torch.randn(1, h, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
        # The shared expert is stored as one more expert (index s.experts; routing never
        # picks it), so that the "+shared" variants can run it in the grouped launches.
        gu = ws.experts_gate_up = Experts.make(s.experts + 1, 2 * s.moe_intermediate, h, dev, gen)
        dn = ws.experts_down = Experts.make(s.experts + 1, h, s.moe_intermediate, dev, gen)
        ws.shared_gate_up = Linear(gu.bf16[s.experts], gu.fp8[s.experts], gu.scale[s.experts])
        ws.shared_down = Linear(dn.bf16[s.experts], dn.fp8[s.experts], dn.scale[s.experts])
        pad = -(s.experts + 1) % ROUTER_ROW_ALIGN
        ws.router_shared = torch.cat((ws.router, ws.shared_gate, ws.router.new_zeros(pad, h)))
    return ws


class Fp8Rows(NamedTuple):
    """A linear's input prepared by its producer: FP8 rows, one float32 scale each."""

    q: torch.Tensor
    scale: torch.Tensor


class Routing(NamedTuple):
    """The experts a step's MoE launches take in place of the step's own top-k (its routing
    kernel still runs, so the step makes the same launches): ``ids [T, top_k]``, and
    ``with_shared [T, top_k + 1]``, the same with the shared expert's index appended, as the
    grouped launches take them with the shared expert inside."""

    ids: torch.Tensor
    with_shared: torch.Tensor

    @classmethod
    def of(cls, ids: torch.Tensor, experts: int) -> Routing:
        """The routing of top-k ``ids`` of a drafter with ``experts`` routed experts (the
        shared expert's index)."""
        ids = ids.contiguous()
        return cls(ids, torch.cat((ids, torch.full_like(ids[:, :1], experts)), dim=1))


LinearFn = Callable[[Any, Linear], torch.Tensor]  # (BF16 rows or Fp8Rows, weight) -> BF16 rows
PrepareFn = Callable[[Linear, int], Prepared | None]  # what the producer of (weight, tokens)'s input hands it


class Variant(NamedTuple):
    path: str  # an FP8 path, ``auto`` or ``bf16``
    env: dict[str, str]  # the environment of its kernels (none: the defaults)
    shared: bool  # the shared expert inside the grouped MoE launches (the default)
    fused: bool  # the grouped MoE kernel prepares its inputs itself (the steps until the ninth session)
    noprep: bool  # dense linears always read BF16 rows (the steps until the tenth session)
    side: bool  # the shared expert on a side stream beside the routed ones (as vLLM runs it)
    nomlp: bool  # the auto step's shared expert in three launches (the steps until the twelfth session)
    moe_rows: bool = False  # the routed experts' FP8 rows from the residual add (step's moe_rows)
    noglu: bool = False  # one token: the down projection applies SiLU * up (the steps until the 15th session)
    own_route: bool = False  # the MoE takes the variant's own top-k (the steps until the 20th session)


def variant_parts(variant: str) -> Variant:
    """``path[+nopdl|+pdl|+late][+noshared][+fused][+noprep][+side][+nomlp][+moerows][+noglu]``
    ``[+ownroute][+KEY=VALUE...]``: the path (an FP8 path or ``bf16``), the environment of its kernels
    (none: the defaults), whether the shared expert runs inside the grouped MoE launches, and
    who prepares the experts' inputs. ``+pdl`` / ``+late`` launch the Triton kernels with
    programmatic dependent launch, dependents let in after the wait / after the main loop;
    ``+nopdl`` without (:mod:`mtpconv.kernels.pdl`). By default (since the seventeenth session,
    both precisions) a MoE step's shared expert is one more expert of the grouped MoE launches,
    which every token picks with its sigmoid gate as the routing weight (``fuse_shared`` of
    :func:`step`);
    ``+noshared``: the shared expert in launches of its own after the routed ones (the steps
    until the sixteenth session; ``+shared`` names the default). ``+fused``: at 2+ tokens the
    grouped kernel applies SiLU * up itself and FP8 experts quantize each token's K tile in
    registers (the steps until the ninth session), where by default a launch of its own prepares
    each projection's input (``split`` of :func:`mtpconv.kernels.triton_moe.routed_experts`);
    ``+noprep``: the ``auto`` step's dense linears read BF16 rows (the steps until the tenth
    session), where by default the producer of an input hands it FP8 rows wherever
    :func:`mtpconv.kernels.takes_prepared` says so (:func:`prepare_fn`). The next two concern
    a shared expert in launches of its own and imply ``+noshared``: ``+side``: it runs on a side
    stream beside the routed experts, as vLLM runs shared experts at up to
    ``VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD`` (256) tokens, where otherwise it runs after
    them on the step's stream; ``+nomlp``: the ``auto`` step's shared expert takes three
    launches (two linears and SiLU * up) at 1-4 tokens too, where otherwise
    :func:`mtpconv.kernels.fp8_mlp` runs it in one where it can (:func:`mlp_fn`). ``+moerows``:
    at 2+ tokens the residual add that writes the routed experts' input (and the shared
    expert's, inside the grouped launches) also hands them its FP8 rows (``moe_rows`` of
    :func:`step`), where otherwise they quantize it themselves.
    ``+noglu``: at one token the routed down projection applies SiLU * up to the gate/up
    projection's output in every program (the steps until the fifteenth session), where by
    default the gate/up projection writes SiLU * up itself (``glu`` of
    :func:`mtpconv.kernels.triton_moe.routed_experts`); ``+ownroute``: the MoE launches take
    the experts the variant's own routing kernel picks (the steps until the twentieth session),
    where by default they take those the BF16 step picks for the same weights and tokens
    (:func:`bf16_routing`), so that both precisions read the same experts; ``+KEY=VALUE`` sets
    the kernels' setting ``MTPCONV_KEY`` while the variant's graphs are captured."""
    base, *mods = variant.split("+")
    env: dict[str, str] = {}
    fused = noprep = side = nomlp = moe_rows = noglu = own_route = False
    shared: bool | None = None  # None: the default, in the grouped launches
    for mod in mods:
        if mod == "nopdl":
            env[pdl.ENV] = "0"
        elif mod == "pdl":
            env[pdl.ENV] = "1"
        elif mod == "late":
            env[pdl.ENV] = "late"
        elif mod in ("shared", "noshared"):
            if shared is not None:
                raise ValueError(f"+shared and +noshared both in {variant!r}")
            shared = mod == "shared"
        elif mod == "fused":
            fused = True
        elif mod == "noprep":
            noprep = True
        elif mod == "side":
            side = True
        elif mod == "nomlp":
            nomlp = True
        elif mod == "moerows":
            moe_rows = True
        elif mod == "noglu":
            noglu = True
        elif mod == "ownroute":
            own_route = True
        elif "=" in mod:  # KEY=VALUE: MTPCONV_KEY while the variant's graphs are captured
            key, value = mod.split("=", 1)
            env[f"MTPCONV_{key}"] = value
        else:
            raise ValueError(f"unknown variant modifier {mod!r} in {variant!r}")
    own_launches = side or nomlp  # modifiers of a shared expert in launches of its own
    if shared and own_launches:
        raise ValueError(f"{variant!r}: +side and +nomlp need the shared expert's own launches")
    in_grouped = not own_launches if shared is None else shared
    return Variant(base, env, in_grouped, fused, noprep, side, nomlp, moe_rows, noglu, own_route)


def is_bf16(variant: str) -> bool:
    return variant_parts(variant)[0] == "bf16"


@contextlib.contextmanager
def variant_env(variant: str) -> Iterator[None]:
    """The variant's kernel environment while its graphs are captured."""
    env = variant_parts(variant).env
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


AUTO = "auto"  # the variant whose linears take fp8_linear's own choice of path


def linear_fn(variant: str, input_scale: torch.Tensor) -> LinearFn:
    variant = variant_parts(variant)[0]
    if variant == "bf16":
        return lambda x, w: F.linear(x, w.bf16)
    if variant == AUTO:  # no static activation scale; one weight scale per linear here

        def auto(x: Any, w: Linear) -> torch.Tensor:
            if isinstance(x, Fp8Rows):
                return fp8_linear(x.q, w.fp8, w.scale, x_scale=x.scale, out_dtype=torch.bfloat16)
            return fp8_linear(x, w.fp8, w.scale)

        return auto
    path = Fp8Path(variant)
    return lambda x, w: run_path(path, x, w.fp8, w.scale, input_scale=input_scale)


def prepare_fn(variant: str) -> PrepareFn | None:
    """The ``auto`` step's choice of which linears get FP8 rows from their producer (none for
    other variants and ``+noprep``)."""
    parts = variant_parts(variant)
    if parts.path != AUTO or parts.noprep:
        return None
    return lambda w, t: takes_prepared(t, *w.fp8.shape)


MlpFn = Callable[[torch.Tensor, Linear, Linear], torch.Tensor]  # (BF16 rows, gate_up, down) -> BF16 rows


def mlp_fn(variant: str) -> MlpFn | None:
    """The ``auto`` step's shared expert in one call, :func:`mtpconv.kernels.fp8_mlp` (one
    launch at 1-4 tokens where it can; its three launches elsewhere); None for other variants
    and ``+nomlp``."""
    parts = variant_parts(variant)
    if parts.path != AUTO or parts.nomlp:
        return None
    return lambda x, gu, dn: fp8_mlp(x, gu.fp8, gu.scale, dn.fp8, dn.scale)


def one_launch_mlp(x: torch.Tensor, gate_up: Linear | None, down: Linear | None) -> bool:
    """Whether :func:`mtpconv.kernels.fp8_mlp` runs the shared expert on ``x``'s rows in one
    launch (else its three launches, which FP8 rows from the producer serve better)."""
    from mtpconv.kernels import mlp

    if gate_up is None or down is None:
        return False
    return mlp.one_launch(x, gate_up.fp8, gate_up.scale, down.fp8, down.scale)


# (h, ids, weights, gate_up, down, h's FP8 rows from the launch that wrote h, or None) -> pair rows
MoeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Experts, Experts, "Fp8Rows | None"], torch.Tensor]


def moe_fn(variant: str, kind: str) -> MoeFn:
    """Routed experts ``(h, ids, weights, gate_up, down) -> [T*k, H]``, one row per (token,
    expert) pair with its routing weight applied (the step sums them), the same kernels
    for both precisions. ``grouped``: each hit expert read once for all its tokens, SiLU *
    up prepared by a launch of its own at 2+ tokens and written by the gate/up projection at
    one (fused into the down projection's load with ``+fused`` / ``+noglu``), the routing
    weight in the down projection's epilogue
    (with a ``+shared`` variant the shared expert comes as one more expert that every
    token picks: :func:`step`); ``pair``: one GEMV per (token, expert) pair (the earlier
    kernel)."""
    from mtpconv.kernels import triton_moe, triton_moe_pairs

    def w(e: Experts) -> tuple[torch.Tensor, torch.Tensor | None]:
        return (e.bf16, None) if is_bf16(variant) else (e.fp8, e.scale)

    fused = variant_parts(variant).fused
    glu = False if variant_parts(variant).noglu else None

    def grouped(
        h: torch.Tensor,
        ids: torch.Tensor,
        tw: torch.Tensor,
        gu: Experts,
        dn: Experts,
        rows: Fp8Rows | None = None,
    ) -> torch.Tensor:
        return triton_moe.routed_experts(
            h,
            w(gu),
            w(dn),
            ids,
            tw,
            split=False if fused else None,
            h_fp8=rows,
            glu=glu,
        )

    def pair(
        h: torch.Tensor,
        ids: torch.Tensor,
        tw: torch.Tensor,
        gu: Experts,
        dn: Experts,
        rows: Fp8Rows | None = None,
    ) -> torch.Tensor:
        y = triton_moe_pairs.wo_moe(h, *w(gu), ids, x_per_pair=False)
        d = triton_moe_pairs.wo_moe(silu_mul(y), *w(dn), ids, x_per_pair=True)
        return d * tw.reshape(-1, 1)

    return pair if kind == "pair" else grouped


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    g, u = x.chunk(2, dim=-1)
    return F.silu(g) * u


GLUES = ("fused", "torch")  # how a step routes and sums: see step()
_SIDE: dict[int, torch.cuda.Stream] = {}  # per device: the stream the shared expert runs on


def beside(fn: Callable[[], torch.Tensor], dev: torch.device) -> tuple[torch.Tensor, torch.cuda.Event]:
    """``fn()`` on a side stream that first waits for the work queued so far (as vLLM runs
    shared experts beside the routed ones): its output and the event that marks its end,
    for the step's stream to wait on before it reads the output."""
    main = torch.cuda.current_stream(dev)
    side = _SIDE.setdefault(dev.index or 0, torch.cuda.Stream(dev))
    side.wait_stream(main)
    with torch.cuda.stream(side):
        out = fn()
    done = torch.cuda.Event()
    done.record(side)
    out.record_stream(main)
    return out, done


def step(
    s: Shape,
    ws: WeightSet,
    emb: torch.Tensor,
    hid: torch.Tensor,
    lin: LinearFn,
    moe: MoeFn | None,
    full_head: bool,
    fuse_shared: bool = False,
    glue: str = "fused",
    prepare: PrepareFn | None = None,
    side_shared: bool = False,
    mlp: MlpFn | None = None,
    moe_rows: bool = False,
    routing: Routing | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One drafter step; returns (logits, topk_ids or None). ``fuse_shared``: the shared
    expert's gate computed with the router and the expert itself in the grouped MoE
    launches (what the variants do unless ``+noshared``), in both precisions. ``glue``, the same in both
    precisions: ``fused`` routes with one top-k softmax kernel (as vLLM's
    ``topk_softmax``), takes SiLU * up in one kernel and adds the experts, the gated
    shared expert and the residual in one (:mod:`mtpconv.kernels.triton_glue`);
    ``torch`` does each with torch ops (softmax, topk, sum, divide, casts: the step of
    the first sessions' figures). ``prepare`` (with ``fused`` glue): the linears whose
    input its producer hands over as FP8 rows (:class:`Fp8Rows`, one scale a row or for the
    tensor), that producer being the launch the step makes there anyway: the concatenation
    before ``fc``, the copy of the attention stand-in, a residual add, SiLU * up or the MoE
    sum (:mod:`mtpconv.kernels.triton_quant`, ``triton_glue.combine_quant``); ``qkv``'s
    producer is ``fc`` itself, so it always reads BF16 rows. With ``fused`` glue and
    ``side_shared`` the shared expert runs on a side stream beside the routed experts
    (:func:`beside`). ``mlp``: the shared expert on BF16 rows in one call (:func:`mlp_fn`).
    ``moe_rows`` (with ``fused`` glue, 2+ tokens): the residual add that writes the routed
    experts' input (and the shared expert's, with ``fuse_shared``) also hands them its FP8
    rows (``add_quant``), so that they quantize nothing themselves. ``routing``: the experts
    the MoE launches take, in place of those the step's routing picks (which still runs)."""
    fused = glue == "fused"
    if fused:
        from mtpconv.kernels import triton_glue, triton_moe, triton_quant, triton_quant_tensor
    act = triton_glue.silu_mul if fused else silu_mul
    t = emb.shape[0]

    def kind(w: Linear | None) -> Prepared | None:
        return prepare(w, t) if fused and prepare is not None and w is not None else None

    def fp8(w: Linear | None) -> bool:  # FP8 rows with one scale each
        return kind(w) is Prepared.TOKEN

    def add(a: torch.Tensor, b: torch.Tensor, nxt: Linear | None) -> tuple[torch.Tensor, Any]:
        """``a + b``, and the next linear's input: the sum, or its FP8 rows."""
        k = kind(nxt)
        if k is not None:
            quant = triton_quant.add_quant if k is Prepared.TOKEN else triton_quant_tensor.add_quant_tensor
            total, q, sc = quant(a, b)
            return total, Fp8Rows(q, sc)
        total = a + b
        return total, total

    def silu_in(x: torch.Tensor, nxt: Linear) -> Any:
        return Fp8Rows(*triton_quant.quant_per_token(x, act=True)) if fp8(nxt) else act(x)

    head = ws.head_full if full_head else ws.head_draft
    x: Any = Fp8Rows(*triton_quant.quant_cat(emb, hid)) if fp8(ws.fc) else torch.cat((emb, hid), dim=-1)
    h = lin(x, ws.fc)
    qkv = lin(h, ws.qkv)
    attn = qkv[:, : s.o_in]  # stands in for attention output (same bytes, no KV cache)
    mlp_input = ws.gate_up if s.experts == 0 else ws.shared_gate_up
    if s.experts and (
        fuse_shared or (mlp is not None and one_launch_mlp(h, ws.shared_gate_up, ws.shared_down))
    ):
        # the grouped launches prepare their own input; the one-launch shared expert reads
        # BF16 rows, whatever its linears' table
        mlp_input = None
    o_out = lin(Fp8Rows(*triton_quant.quant_per_token(attn)) if fp8(ws.o) else attn.contiguous(), ws.o)
    h_rows: Fp8Rows | None = None  # h's FP8 rows for the routed experts, from the add that writes h
    if (
        moe_rows
        and fused
        and s.experts
        and 1 < t <= triton_moe.GROUPED_MAX_TOKENS
        and kind(mlp_input) is None
    ):
        h, q, sc = triton_quant.add_quant(h, o_out)
        x, h_rows = h, Fp8Rows(q, sc)
    else:
        h, x = add(h, o_out, mlp_input)
        if moe_rows and isinstance(x, Fp8Rows) and kind(mlp_input) is Prepared.TOKEN:
            h_rows = x
    ids = None
    if s.experts == 0:
        assert ws.gate_up is not None and ws.down is not None
        h, x = add(h, lin(silu_in(lin(x, ws.gate_up), ws.down), ws.down), head)
    else:
        assert ws.router is not None and ws.shared_gate is not None and moe is not None
        assert ws.shared_gate_up is not None and ws.shared_down is not None
        assert ws.experts_gate_up is not None and ws.experts_down is not None
        assert ws.router_shared is not None
        gu, dn = ws.experts_gate_up, ws.experts_down
        if fused:  # router and shared gate in one GEMM, then one routing kernel
            logits = F.linear(h, ws.router_shared)[:, : s.experts + 1]
            all_ids, all_w, gate = triton_glue.topk_softmax(
                logits, s.top_k, s.experts, weight_dtype=h.dtype, append_shared=fuse_shared
            )
            if routing is not None:
                all_ids = routing.with_shared if fuse_shared else routing.ids
            ids = all_ids[:, : s.top_k]
            parts: tuple[torch.Tensor, ...]
            if fuse_shared:  # the shared expert as expert E
                parts = (h, moe(h, all_ids, all_w, gu, dn, h_rows))
            else:
                sgu, sdn = ws.shared_gate_up, ws.shared_down

                def shared_expert(x: Any = x) -> torch.Tensor:
                    if mlp is not None and not isinstance(x, Fp8Rows):
                        return mlp(x, sgu, sdn)
                    return lin(silu_in(lin(x, sgu), sdn), sdn)

                if side_shared:
                    shared, done = beside(shared_expert, h.device)
                    routed = moe(h, ids, all_w, gu, dn, h_rows)
                    torch.cuda.current_stream(h.device).wait_event(done)
                    parts = (h, routed, shared, gate)
                else:
                    shared = shared_expert()
                    parts = (h, moe(h, ids, all_w, gu, dn, h_rows), shared, gate)
            if fp8(head):
                h, q, sc = triton_glue.combine_quant(*parts)
                x = Fp8Rows(q, sc)
            else:
                h = x = triton_glue.combine(*parts)
        else:
            if fuse_shared:  # router and shared gate in one GEMM; the shared expert as expert E
                logits = F.linear(h, ws.router_shared)[:, : s.experts + 1].float()
                probs = torch.softmax(logits[:, : s.experts], dim=-1)
            else:
                probs = torch.softmax(F.linear(h, ws.router).float(), dim=-1)
            topw, ids = torch.topk(probs, s.top_k, dim=-1)
            if routing is not None:
                ids = routing.ids
            topw = topw / topw.sum(-1, keepdim=True)
            if fuse_shared:
                all_ids = torch.cat((ids, torch.full_like(ids[:, :1], s.experts)), dim=-1)
                all_w = torch.cat((topw, torch.sigmoid(logits[:, s.experts :])), dim=-1).to(h.dtype)
                h = h + moe(h, all_ids, all_w, gu, dn, None).view(t, s.top_k + 1, -1).sum(1)
            else:
                routed = moe(h, ids, topw.to(h.dtype), gu, dn, None).view(t, s.top_k, -1).sum(1)
                shared = lin(act(lin(h, ws.shared_gate_up)), ws.shared_down)
                h = h + routed + torch.sigmoid(F.linear(h, ws.shared_gate)) * shared
            x = h
    logits = lin(x, head)
    return logits, ids


def bf16_routing(
    s: Shape, ws: WeightSet, emb: torch.Tensor, hid: torch.Tensor, glue: str = "fused"
) -> Routing | None:
    """The experts the BF16 step (the default ``bf16`` variant) picks for ``ws`` and these
    tokens, which every variant's MoE launches take unless ``+ownroute``; None for a dense
    drafter. With random weights, the hidden state an FP8 step routes on differs enough from
    the BF16 one to change some picks, and with them how many distinct experts the step reads
    (Qwen3.5-397B at 4 tokens: 38 in FP8 against 37 in BF16, every run of the eighteenth and
    nineteenth sessions): the two steps would no longer do the same work."""
    if not s.experts:
        return None
    with variant_env("bf16"):
        _, ids = step(s, ws, emb, hid, linear_fn("bf16", emb.new_ones(())), moe_fn("bf16", "grouped"),
                      False, variant_parts("bf16").shared, glue)  # fmt: skip
    assert ids is not None
    return Routing.of(ids, s.experts)


def step_bytes(s: Shape, ws: WeightSet, variant: str, full_head: bool, distinct: int) -> int:
    """Weight bytes one step must read (activations are negligible at these sizes)."""
    fp8 = not is_bf16(variant)

    def lb(w: Linear) -> int:
        return w.fp8.numel() if fp8 else 2 * w.bf16.numel()

    total = lb(ws.fc) + lb(ws.qkv) + lb(ws.o) + lb(ws.head_full if full_head else ws.head_draft)
    if s.experts == 0:
        assert ws.gate_up is not None and ws.down is not None
        total += lb(ws.gate_up) + lb(ws.down)
    else:
        assert ws.shared_gate_up is not None and ws.shared_down is not None
        assert ws.router is not None and ws.shared_gate is not None
        total += lb(ws.shared_gate_up) + lb(ws.shared_down)
        total += 2 * (ws.router.numel() + ws.shared_gate.numel())
        per_expert = 3 * s.moe_intermediate * s.hidden
        total += distinct * per_expert * (1 if fp8 else 2)
    return total


def time_graph(fn: Callable[[], Any], reps: int, replays: int = 30) -> float:
    """Median microseconds of one ``fn`` call: ``reps`` calls captured in one graph, timed
    the way ``--timing`` says (:func:`graph_times`)."""
    return chosen(graph_times(fn, reps, replays))


# How a graph's replays are timed: "single", each replay launched on an idle GPU and waited
# for (the default, every session's figures; the host's graph launch may fall inside each
# sample), or "queued", each replay queued behind the one before while the GPU runs (as a
# decode loop replays its graphs). Measured side by side (eleventh session): single was
# 0.3-6.4 us slower on every 32k-head step.
TIMINGS = ("queued", "single")
TIMING = "single"


def chosen(times: tuple[float, float]) -> float:
    """The one of :func:`graph_times`' ``(queued, single)`` that ``--timing`` picks."""
    return times[0] if TIMING == "queued" else times[1]


def graph_times(fn: Callable[[], Any], reps: int, replays: int = 30) -> tuple[float, float]:
    """Median microseconds of one ``fn`` call (``reps`` calls captured in one graph), from the
    same graph timed both ways of :data:`TIMINGS`: ``(queued, single)``."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    single = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        single.append(a.elapsed_time(b) * 1000.0 / reps)
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
    graph.replay()  # untimed: the GPU is busy while the timed replays queue behind it
    marks[0].record()
    for i in range(replays):
        graph.replay()
        marks[i + 1].record()
    marks[-1].synchronize()
    queued = [marks[i].elapsed_time(marks[i + 1]) * 1000.0 / reps for i in range(replays)]
    del graph
    return statistics.median(queued), statistics.median(single)


def copy_bandwidth(dev: torch.device) -> float:
    """Device-to-device copy, bytes read + written per second (TB/s), eager, median of 10."""
    n = 2 * 2**30
    src = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return 2 * n / statistics.median(times) / 1e12


@dataclass
class Row:
    model: str
    tokens: int
    variant: str
    head: str
    us: float
    bytes: int
    tbps: float
    pct_copy: float
    distinct_experts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def fp8_variants(paths: list[str]) -> list[str]:
    return [p for p in paths if p != "bf16"]  # "bf16+..." variants are listed as their own columns


def bench_model(
    key: str,
    tokens_list: list[int],
    variants: list[str],
    copy_tbps: float,
    dev: torch.device,
    moe_kind: str = "grouped",
    glue: str = "fused",
) -> list[Row]:
    s = SHAPES[key]
    t0 = time.time()
    sets = [build_weights(s, dev, seed=1, head_full=None)]
    one = step_bytes(s, sets[0], "fp8", full_head=False, distinct=s.top_k)
    n_sets = max(1, min(3, math.ceil(L2_SAFE_BYTES / one)))
    for i in range(1, n_sets):
        # Extra sets share the full head (2.5 GB BF16 alone is far past L2).
        sets.append(build_weights(s, dev, seed=1 + i, head_full=sets[0].head_full))
    torch.cuda.synchronize()
    print(f"[{s.name}] {n_sets} weight set(s) built in {time.time() - t0:.1f}s", flush=True)
    input_scale = torch.tensor(4.0 / 448.0, device=dev)
    rows: list[Row] = []
    for t in tokens_list:
        gen = torch.Generator(device=dev).manual_seed(t)
        emb = torch.randn(t, s.hidden, device=dev, generator=gen).to(torch.bfloat16)
        hid = torch.randn(t, s.hidden, device=dev, generator=gen).to(torch.bfloat16)
        shared_routes = [bf16_routing(s, ws, emb, hid, glue) for ws in sets]
        for variant in variants:
            own_route = variant_parts(variant).own_route
            routes: list[Routing | None] = [None] * n_sets if own_route else shared_routes
            lin = linear_fn(variant, input_scale)
            moe = moe_fn(variant, moe_kind) if s.experts else None
            shared = variant_parts(variant).shared and s.experts > 0
            side = variant_parts(variant).side
            prep = prepare_fn(variant)
            mlp = mlp_fn(variant)
            mrows = variant_parts(variant).moe_rows
            for full_head in (True, False):
                with variant_env(variant):
                    _, ids = step(s, sets[0], emb, hid, lin, moe, full_head, shared, glue, prep, side, mlp,
                                  mrows, routes[0])  # fmt: skip
                distinct = int(ids.unique().numel()) if ids is not None else 0

                def run(
                    lin: LinearFn = lin,
                    moe: Any = moe,
                    full_head: bool = full_head,
                    emb: torch.Tensor = emb,
                    hid: torch.Tensor = hid,
                    sets: list[WeightSet] = sets,
                    shared: bool = shared,
                    prep: PrepareFn | None = prep,
                    side: bool = side,
                    mlp: MlpFn | None = mlp,
                    mrows: bool = mrows,
                    routes: list[Routing | None] = routes,
                ) -> None:
                    for ws, route in zip(sets, routes, strict=True):
                        step(s, ws, emb, hid, lin, moe, full_head, shared, glue, prep, side, mlp, mrows,
                             route)  # fmt: skip

                try:
                    with variant_env(variant):
                        queued, single = graph_times(run, reps=1)
                    us = chosen((queued, single)) / n_sets
                except Exception as exc:  # report and go on: one failing path must not end the run
                    print(f"  {s.name} T={t} {variant} FAILED: {exc!r}"[:400], flush=True)
                    continue
                nbytes = step_bytes(s, sets[0], variant, full_head, distinct)
                tbps = nbytes / (us * 1e-6) / 1e12
                head = f"{s.vocab // 1000}k" if full_head else "32k"
                rows.append(
                    Row(s.name, t, variant, head, us, nbytes, tbps, 100 * tbps / copy_tbps, distinct,
                        {"us_single": single / n_sets, "us_queued": queued / n_sets})
                )  # fmt: skip
                print(
                    f"  {s.name} T={t:<3} {variant:<22} head={head:<5} {us:8.1f} us "
                    f"{nbytes / 1e6:8.1f} MB {tbps:5.2f} TB/s "
                    f"({100 * tbps / copy_tbps:4.0f}% copy)",
                    flush=True,
                )
    del sets
    torch.cuda.empty_cache()
    return rows


def micro(
    shape_key: str,
    tokens_list: list[int],
    variants: list[str],
    dev: torch.device,
    per_row: bool = False,
) -> list[dict[str, Any]]:
    """Per-linear times at one model's shapes, weight copies rotated past L2."""
    s = SHAPES[shape_key]
    h = s.hidden
    shapes = {
        "fc": (h, 2 * h),
        "qkv": (s.q_out + 2 * s.kv_out, h),
        "o": (h, s.o_in),
        "gate_up": (2 * s.intermediate, h),
        "down": (h, s.intermediate),
        "head32k": (DRAFT_VOCAB, h),
    }
    input_scale = torch.tensor(4.0 / 448.0, device=dev)
    out: list[dict[str, Any]] = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for name, (n, k) in shapes.items():
        copies = max(2, math.ceil(L2_SAFE_BYTES / (n * k)))
        ws = [Linear.make(n, k, dev, gen) for _ in range(copies)]
        if per_row:  # distinct per-row scales, as fused shards with their own scales give
            for w in ws:
                w.scale = w.scale * (1 + torch.rand(n, device=dev, generator=gen))
        for t in tokens_list:
            x = torch.randn(t, k, device=dev, generator=gen).to(torch.bfloat16)
            for variant in variants:
                if per_row and variant == "scaled_mm_static":
                    continue
                lin = linear_fn(variant, input_scale)

                def g(lin: LinearFn = lin, x: torch.Tensor = x, ws: list[Linear] = ws) -> None:
                    for w in ws:
                        lin(x, w)

                try:
                    with variant_env(variant):
                        queued, single = graph_times(g, reps=1)
                except Exception as exc:  # report and go on
                    print(f"  micro {name} T={t} {variant} FAILED: {exc!r}"[:400], flush=True)
                    continue
                queued, single = queued / copies, single / copies
                us = chosen((queued, single))
                nbytes = n * k * (2 if is_bf16(variant) else 1)
                out.append(
                    {
                        "linear": name,
                        "n": n,
                        "k": k,
                        "tokens": t,
                        "variant": variant,
                        "per_row": per_row,
                        "us": us,
                        "tbps": nbytes / (us * 1e-6) / 1e12,
                        "us_single": single,
                        "us_queued": queued,
                        "tbps_queued": nbytes / (queued * 1e-6) / 1e12,
                    }
                )
        del ws
        torch.cuda.empty_cache()
        print(f"  micro {name} done", flush=True)
    return out


def dense_shapes(s: Shape) -> dict[str, tuple[int, int]]:
    """The FP8 dense linears of one drafter step: name -> (N, K)."""
    h = s.hidden
    out = {"fc": (h, 2 * h), "qkv": (s.q_out + 2 * s.kv_out, h), "o": (h, s.o_in)}
    if s.experts == 0:
        out |= {"gate_up": (2 * s.intermediate, h), "down": (h, s.intermediate)}
    else:
        out |= {"shared_gate_up": (2 * s.shared_intermediate, h), "shared_down": (h, s.shared_intermediate)}
    out["head32k"] = (DRAFT_VOCAB, h)
    return out


def narrow_configs(t: int, sms: int) -> list[Any]:
    """The narrow-load GEMV's swept configurations at ``t`` (1-4) tokens: block_k = 256 x
    warps (no layout exchange in the K loop), 2-8 warps, 1-16 rows a program; K cut to fill
    4-16 waves of programs (``split_for``) or, at one token, in one or two pieces."""
    from mtpconv.kernels.triton_skinny import Config

    tiles = [(bn, 512, 2) for bn in (2, 4, 8, 16)] + [(bn, 1024, 4) for bn in (1, 2, 4, 8)]
    tiles += [(bn, 2048, 8) for bn in (2, 4, 8)]
    progs = (4, 8, 12, 16) if t == 1 else (4, 8, 16)
    cfgs = [Config(False, bn, bk, w, 3, p * sms, 0, False, True) for bn, bk, w in tiles for p in progs]
    if t == 1:
        cfgs += [
            Config(False, bn, bk, w, 3, 4 * sms, 0, False, True, split=pieces)
            for bn, bk, w in tiles
            for pieces in (1, 2)
        ]
    return cfgs


def skinny_configs(t: int, sms: int, narrow_only: bool = False) -> list[Any]:
    """The skinny GEMM's swept configurations at ``t`` tokens (``narrow_only``: those of
    :func:`narrow_configs`)."""
    from mtpconv.kernels.triton_skinny import Config

    narrow = narrow_configs(t, sms) if t <= 4 else []
    if narrow_only:
        return narrow
    cfgs = []
    if t == 1:  # (TMA never won at one token in the sweeps of 2026-12-01: not swept there)
        shapes = [
            (4, 512, 4),
            (8, 256, 4),
            (16, 256, 4),
            (32, 256, 8),
            (8, 512, 4),
            (16, 512, 8),
            (8, 1024, 8),
        ]
        for bn, bk, warps in shapes:
            for progs in (4, 8, 12, 16):
                for stages in (3, 4):
                    cfgs.append(Config(False, bn, bk, warps, stages, progs * sms, 0))
        return cfgs + narrow
    tiles = [
        (64, 128, 4, 4),
        (32, 256, 4, 2),
        (32, 256, 4, 4),
        (64, 256, 4, 2),
        (128, 128, 4, 2),
        (64, 128, 8, 8),
    ]
    for bn, bk, warps, progs in tiles:
        for stages in (3, 4):
            for tma in (False, True):
                cfgs.append(Config(True, bn, bk, warps, stages, progs * sms, 2, tma))
    return narrow + cfgs


def time_configs(
    cfgs: list[Any], run: Callable[[Any], None], calls: int, label: str
) -> list[tuple[float, Any]]:
    """``(us, config)`` per configuration, in order: ``run(cfg)`` makes ``calls`` launches
    (over weight copies or id sets rotated so nothing stays in L2), timed in a CUDA graph.
    A configuration that fails is reported and left out."""
    res = []
    for cfg in cfgs:
        try:
            us = time_graph(functools.partial(run, cfg), reps=1, replays=15) / calls
        except Exception as exc:  # report and go on
            print(f"  sweep {label} {cfg} FAILED: {exc!r}"[:300], flush=True)
            continue
        res.append((us, cfg))
    return res


def time_skinny(x: torch.Tensor, ws: list[Linear], cfgs: list[Any], label: str) -> list[tuple[float, Any]]:
    """:func:`time_configs` of skinny-GEMM configurations: one linear on ``x`` over the
    weight copies ``ws``."""
    from mtpconv.kernels import triton_skinny

    def run(cfg: Any) -> None:
        for w in ws:
            triton_skinny.skinny_linear(x, w.fp8, w.scale, config=cfg)

    return time_configs(cfgs, run, len(ws), label)


def routing_sets(s: Shape, t: int, dev: torch.device, gen: torch.Generator, n: int = 8) -> list[torch.Tensor]:
    """``n`` random routings of ``t`` tokens (``[t, top_k]`` distinct experts each), to
    rotate so that the experts a sweep reads do not stay in L2."""
    return [
        torch.stack([torch.randperm(s.experts, device=dev, generator=gen)[: s.top_k] for _ in range(t)])
        for _ in range(n)
    ]


def time_grouped(
    x: torch.Tensor,
    ex: Experts,
    fp8: bool,
    act: bool,
    id_sets: list[torch.Tensor],
    cfgs: list[Any],
    label: str,
    split: bool = False,
) -> list[tuple[float, Any]]:
    """:func:`time_configs` of grouped-MoE configurations: the experts ``ex`` (FP8 or BF16)
    on ``x`` (the down projection's ``[gate | up]`` pair rows when ``act``), one launch per
    routing of ``id_sets``. ``split``: a launch of its own prepares each input first, timed
    with it (:func:`mtpconv.kernels.triton_moe.moe_projection`, as ``routed_experts`` runs
    a projection)."""
    from mtpconv.kernels import triton_moe

    w, sc = (ex.fp8, ex.scale) if fp8 else (ex.bf16, None)

    def run(cfg: Any) -> None:
        for ids in id_sets:
            triton_moe.moe_projection(x, w, sc, ids, x_per_pair=act, act=act, split=split, config=cfg)

    return time_configs(cfgs, run, len(id_sets), label)


def moe_one_token_configs(fp8: bool, k: int) -> list[tuple[int, int, int, int, int]]:
    """The grouped MoE kernel's swept configurations at one token, experts ``[E, N, k]``:
    the MMA with the fewest and most warps, the CUDA-core FMA, and the narrow-load FMA with
    block_k = 256 x warps (no layout exchange in the K loop), 2-8 warps, up to ``k``; also
    narrow-load tiles of 32-128 rows with K steps of 64-128 bytes, whose threads split the
    rows more than K, so that each row's sum at the end takes fewer shuffles (24-32 a thread
    against 41, compiled offline; eighteenth session)."""
    from mtpconv.kernels import triton_moe

    mma = triton_moe.DOT_FP8 if fp8 else triton_moe.DOT
    out = [(bn, 128, warps, 3, mma) for bn in (64, 128) for warps in (4, 8)]
    out += [(bn, bk, 4, 3, triton_moe.FMA) for bn in (8, 16, 32) for bk in (256, 512)]
    out += [
        (bn, 256 * warps, warps, 3, triton_moe.FMA_NARROW)
        for warps in (2, 4, 8)
        for bn in (2, 4, 8, 16, 32)
        if 256 * warps <= k and bn * 256 * warps <= 32 * 1024
    ]
    out += [
        (bn, bk, warps, 3, triton_moe.FMA_NARROW)
        for bn, bk, warps in ((32, 128, 2), (64, 64, 2), (64, 128, 4))
    ]
    return out


def sweep(
    tokens_list: list[int], dev: torch.device, only: list[str] | None = None, narrow_only: bool = False
) -> list[dict[str, Any]]:
    """Time the skinny GEMM at every configuration of ``skinny_configs`` on every model's
    dense FP8 linears, and the grouped MoE kernel on the experts; best first per shape."""
    from mtpconv.kernels import triton_moe, triton_skinny

    sms = triton_skinny.sm_count(dev.index or 0)
    out: list[dict[str, Any]] = []
    gen = torch.Generator(device=dev).manual_seed(0)
    seen: set[tuple[int, int]] = set()
    for s in SHAPES.values():
        if only and s.name not in only:
            continue
        for name, (n, k) in dense_shapes(s).items():
            if (n, k) in seen:
                continue
            seen.add((n, k))
            copies = max(2, math.ceil(L2_SAFE_BYTES / (n * k)))
            ws = [Linear.make(n, k, dev, gen) for _ in range(copies)]
            for t in tokens_list:
                x = torch.randn(t, k, device=dev, generator=gen).to(torch.bfloat16)
                cfgs = skinny_configs(t, sms, narrow_only)
                if narrow_only:  # against the configuration the skinny GEMM takes now
                    cfgs = [triton_skinny.default_config(t, n, k, sms)] + cfgs
                res = sorted(time_skinny(x, ws, cfgs, f"{n}x{k} T={t}"), key=lambda r: r[0])
                for rank, (us, cfg) in enumerate(res[:3]):
                    tbps = n * k / (us * 1e-6) / 1e12
                    out.append(
                        {
                            "model": s.name,
                            "linear": name,
                            "n": n,
                            "k": k,
                            "tokens": t,
                            "rank": rank,
                            "config": list(cfg),
                            "us": us,
                            "tbps": tbps,
                        }
                    )
                print(
                    f"  sweep {s.name} {name} {n}x{k} T={t}: best {res[0][1]} {res[0][0]:.1f} us "
                    f"({n * k / (res[0][0] * 1e-6) / 1e12:.2f} TB/s)",
                    flush=True,
                )
            del ws
            torch.cuda.empty_cache()
        if s.experts == 0 or narrow_only:
            continue
        ex_gu = Experts.make(s.experts, 2 * s.moe_intermediate, s.hidden, dev, gen)
        ex_dn = Experts.make(s.experts, s.hidden, s.moe_intermediate, dev, gen)
        for t in tokens_list:
            id_sets = routing_sets(s, t, dev, gen)
            h = torch.randn(t, s.hidden, device=dev, generator=gen).to(torch.bfloat16)
            y = torch.randn(t * s.top_k, 2 * s.moe_intermediate, device=dev, generator=gen).to(torch.bfloat16)
            distinct = sum(int(i.unique().numel()) for i in id_sets) / len(id_sets)
            cases = [("experts_gate_up", ex_gu, h, False, True), ("experts_down", ex_dn, y, True, True)]
            if t == 1:  # the BF16 baseline's grouped kernel, swept the same way at one token
                cases += [("experts_gate_up bf16", ex_gu, h, False, False)]
                cases += [("experts_down bf16", ex_dn, y, True, False)]
            for proj, ex, x, act, fp8 in cases:
                modes = (triton_moe.DOT, triton_moe.DOT_FP8) if fp8 else (triton_moe.DOT,)
                cfgs: list[tuple[int, int, int, int, int]] = [
                    (bn, bk, 4, st, mode)
                    for bn in (32, 64, 128)
                    for bk in (128, 256)
                    for st in (3, 4)
                    for mode in modes
                ]
                if t == 1:
                    cfgs += [c for c in moe_one_token_configs(fp8, ex.fp8.shape[2]) if c not in cfgs]
                res = time_grouped(x, ex, fp8, act, id_sets, cfgs, f"moe {proj} T={t}")
                res.sort(key=lambda r: r[0])
                nbytes = distinct * ex.fp8[0].numel() * (1 if fp8 else 2)
                for rank, (us, cfg) in enumerate(res[:3]):
                    out.append(
                        {
                            "model": s.name,
                            "linear": proj,
                            "n": ex.fp8.shape[1],
                            "k": ex.fp8.shape[2],
                            "tokens": t,
                            "rank": rank,
                            "config": list(cfg),
                            "us": us,
                            "tbps": nbytes / (us * 1e-6) / 1e12,
                        }
                    )
                print(
                    f"  sweep {s.name} {proj} T={t} ({distinct:.0f} experts): best {res[0][1]} "
                    f"{res[0][0]:.1f} us ({nbytes / (res[0][0] * 1e-6) / 1e12:.2f} TB/s)",
                    flush=True,
                )
        del ex_gu, ex_dn
        torch.cuda.empty_cache()
    return out


def retune(srows: list[dict[str, Any]], sms: int) -> list[str]:
    """Make each swept dense shape's best configuration the skinny GEMM's table entry for
    the rest of this run (micro, steps); returns the entries as lines of skinny_tuned.py."""
    from mtpconv.kernels import skinny_tuned

    lines = []
    for r in srows:
        if r["rank"] != 0 or r["linear"].startswith("experts"):
            continue
        dot, bn, bk, warps, stages, programs, mma, tma, narrow, *split = r["config"]
        if split and split[0]:
            print(f"  retune: {r['model']} {r['linear']} T={r['tokens']} is best with K in {split[0]} "
                  "fixed pieces, which the table cannot hold: left as it is", flush=True)  # fmt: skip
            continue
        key = (r["tokens"], r["n"], r["k"])
        entry = (dot, bn, bk, warps, stages, programs // sms, mma, tma, narrow)
        skinny_tuned.TUNED[key] = entry
        model = r["model"].replace("-A17B", "").replace("-A3B", "")
        lines.append(f"    {key}: {entry},  # {model} {r['linear']}, {r['tbps']:.2f} TB/s")
    return lines


def srows_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | linear | N x K | tokens | best config | us | TB/s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["rank"] == 0:
            lines.append(
                f"| {r['model']} | {r['linear']} | {r['n']}x{r['k']} | {r['tokens']} | "
                f"{r['config']} | {r['us']:.1f} | {r['tbps']:.2f} |"
            )
    return "\n".join(lines)


def markdown(rows: list[Row], copy_tbps: float, variants: list[str]) -> str:
    lines = [f"Copy bandwidth (D2D, read+write): {copy_tbps:.2f} TB/s", ""]
    models = list(dict.fromkeys(r.model for r in rows))
    fp8s = fp8_variants(variants)
    for model in models:
        mrows = [r for r in rows if r.model == model]
        full = next(r.head for r in mrows if r.head != "32k")
        lines += [f"#### {model}", ""]
        head = f"| tokens | BF16+{full} | BF16+32k |"
        sep = "|---|---|---|"
        for v in fp8s:
            head += f" {v}+{full} | {v}+32k |"
            sep += "---|---|"
        lines += [head, sep]
        for t in sorted({r.tokens for r in mrows}):

            def get(v: str, hd: str, t: int = t, mrows: list[Row] = mrows) -> Row:
                for r in mrows:
                    if r.tokens == t and r.variant == v and r.head == hd:
                        return r
                return Row("", t, v, hd, math.nan, 0, math.nan, math.nan)

            line = f"| {t} | {get('bf16', full).us:.1f} | {get('bf16', '32k').us:.1f} |"
            for v in fp8s:
                line += f" {get(v, full).us:.1f} | {get(v, '32k').us:.1f} |"
            lines.append(line)
        lines += ["", "Ratios (FP8 path + 32k head over BF16), achieved bandwidth of FP8+32k:", ""]
        lines += [
            "| tokens | path | /BF16+32k | /BF16+full | FP8+32k TB/s (% copy) | BF16+32k TB/s |",
            "|---|---|---|---|---|---|",
        ]
        for t in sorted({r.tokens for r in mrows}):
            b32 = get("bf16", "32k", t)
            bfull = get("bf16", full, t)
            for v in fp8s:
                r = get(v, "32k", t)
                lines.append(
                    f"| {t} | {v} | {r.us / b32.us:.2f} | {r.us / bfull.us:.3f} | "
                    f"{r.tbps:.2f} ({r.pct_copy:.0f}%) | {b32.tbps:.2f} |"
                )
        lines.append("")
    return "\n".join(lines)


def micro_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| linear | N x K | tokens | variant | us | TB/s | queued TB/s |", "|---" * 7 + "|"]
    for r in rows:
        lines.append(
            f"| {r['linear']} | {r['n']}x{r['k']} | {r['tokens']} | {r['variant']} | "
            f"{r['us']:.2f} | {r['tbps']:.2f} | {r['tbps_queued']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,4,16,64")
    ap.add_argument(
        "--variants",
        default="bf16,scaled_mm_fused,wo_triton,scaled_mm_token,scaled_mm_tensor,scaled_mm_static",
    )
    ap.add_argument("--micro", action="store_true", help="also time each linear alone (27B shapes)")
    ap.add_argument("--micro-only", action="store_true")
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="sweep the skinny-GEMM and grouped-MoE configurations (all models' shapes)",
    )
    ap.add_argument("--sweep-only", action="store_true", help="the sweep and nothing else")
    ap.add_argument("--sweep-models", default="", help="the sweep's models (default: --models)")
    ap.add_argument("--sweep-tokens", default="", help="the sweep's token counts (default: --tokens)")
    ap.add_argument(
        "--narrow-only",
        action="store_true",
        help="the sweep: dense linears only, the narrow-load GEMV's configurations (1-4 tokens) "
        "against the configuration each shape takes now",
    )
    ap.add_argument(
        "--retune",
        action="store_true",
        help="with --sweep: the sweep's best configurations replace the skinny GEMM's table for this run",
    )
    ap.add_argument(
        "--moe",
        choices=("grouped", "pair"),
        default="grouped",
        help="routed-expert kernel of the step (the same for both precisions)",
    )
    ap.add_argument(
        "--glue",
        choices=GLUES,
        default="fused",
        help="routing, SiLU * up and sums of the step: one kernel each, or torch ops (both precisions)",
    )
    ap.add_argument(
        "--timing",
        choices=TIMINGS,
        default="single",
        help="how graph replays are timed (the step and per-linear rows record both: us_single, us_queued)",
    )
    ap.add_argument(
        "--per-row",
        action="store_true",
        help="with --micro: per-output-row weight scales (fused q/k/v, gate/up shards)",
    )
    args = ap.parse_args(argv)
    global TIMING
    TIMING = args.timing
    variants = args.variants.split(",")
    for v in variants:  # fail early on a typo, before any output
        try:
            path = variant_parts(v).path
            if path not in ("bf16", AUTO):
                Fp8Path(path)
        except ValueError as exc:
            ap.error(f"--variants: {exc}")
    if not torch.cuda.is_available():
        print("bench_draft needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    meta = {
        "device": torch.cuda.get_device_name(dev),
        "capability": list(torch.cuda.get_device_capability(dev)),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__ if triton_available() else None,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "glue": args.glue,
        "timing": args.timing,
    }
    copy_tbps = copy_bandwidth(dev)
    print(f"{meta}\ncopy bandwidth {copy_tbps:.2f} TB/s", flush=True)
    result: dict[str, Any] = {"meta": meta, "copy_tbps": copy_tbps}
    md = ""
    if args.sweep or args.sweep_only:
        sweep_models = (args.sweep_models or args.models).split(",")
        sweep_tokens = [int(t) for t in args.sweep_tokens.split(",")] if args.sweep_tokens else tokens
        srows = sweep(sweep_tokens, dev, [SHAPES[m].name for m in sweep_models], args.narrow_only)
        result["sweep"] = srows
        md += "### Sweep (best per shape)\n\n" + srows_markdown(srows) + "\n\n"
        if args.retune:
            from mtpconv.kernels.triton_skinny import sm_count

            lines = retune(srows, sm_count(dev.index or 0))
            md += "### Retuned skinny-GEMM entries (this run)\n\n```\n" + "\n".join(lines) + "\n```\n\n"
        (args.out / "bench_draft.json").write_text(json.dumps(result, indent=1))
    if args.sweep_only:
        (args.out / "bench_draft.md").write_text(md)
        print(md)
        return 0
    if args.micro or args.micro_only:
        mrows = micro("qwen3.5-27b", tokens, variants, dev, args.per_row)
        result["micro"] = mrows
        md += "### Per-linear (Qwen3.5-27B shapes)\n\n" + micro_markdown(mrows) + "\n\n"
        (args.out / "bench_draft.json").write_text(json.dumps(result, indent=1))
    if not args.micro_only:
        rows: list[Row] = []
        for key in args.models.split(","):
            rows += bench_model(key, tokens, variants, copy_tbps, dev, args.moe, args.glue)
            result["steps"] = [r.__dict__ for r in rows]
            (args.out / "bench_draft.json").write_text(json.dumps(result, indent=1))
        md = f"### Drafter step (glue: {args.glue})\n\n" + markdown(rows, copy_tbps, variants) + "\n" + md
    (args.out / "bench_draft.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
