"""The drafter step at real model shapes: weights, one step, the bytes it must read (CUDA).

One drafter step = ``mtp.fc`` + one MTP decoder layer's linears (fused qkv as vLLM builds
it, o, dense MLP or MoE router + routed experts + shared expert) + the draft head (full
vocabulary or 32,768 rows). Attention math, norms and rotary are left out: they are the same
in every variant and do not touch the weights. Weights are random (std 0.02) and quantized
with the tool's own ``mtpconv.formats.fp8.quantize_fp8``. How a variant runs the step's
linears and experts is :mod:`benchmarks.drafter_step.variants`'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from benchmarks.kernels.prepared import Prepared
from mtpconv.formats.fp8 import quantize_fp8

DRAFT_VOCAB = 32_768
L2_SAFE_BYTES = 400 * 2**20  # a graph reads at least this much before repeating a weight
ROUTER_ROW_ALIGN = 8  # rows of the router + shared-gate GEMM: a multiple of this (bf16: 16 bytes)
GLUES = ("fused", "torch")  # how a step routes and sums: see step()
_SIDE: dict[int, torch.cuda.Stream] = {}  # per device: the stream the shared expert runs on


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
    fc_bf16: bool = False  # the drafter's fc stays BF16 in the variant (MiMo's input_proj)


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
    # MiMo-7B: hidden 4096, 32 q heads / 8 kv heads x 128, MLP 11008, vocab 151,680. Its
    # input_proj stays a BF16 nn.Linear under the plugin (mtpconv/vllm_plugin/mimo.py); the
    # qkv bias is left out (an epilogue add, no weight bytes).
    "mimo-7b": Shape("MiMo-7B", 4096, 151_680, 4096, 1024, 4096, intermediate=11008, fc_bf16=True),
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
MlpFn = Callable[[torch.Tensor, Linear, Linear], torch.Tensor]  # (BF16 rows, gate_up, down) -> BF16 rows
# (h, ids, weights, gate_up, down, h's FP8 rows from the launch that wrote h, or None) -> pair rows
MoeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Experts, Experts, "Fp8Rows | None"], torch.Tensor]


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    g, u = x.chunk(2, dim=-1)
    return F.silu(g) * u


def one_launch_mlp(x: torch.Tensor, gate_up: Linear | None, down: Linear | None) -> bool:
    """Whether :func:`mtpconv.kernels.fp8_mlp` runs the shared expert on ``x``'s rows in one
    launch (else its three launches, which FP8 rows from the producer serve better)."""
    from mtpconv.kernels import mlp

    if gate_up is None or down is None:
        return False
    return mlp.one_launch(x, gate_up.fp8, gate_up.scale, down.fp8, down.scale)


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
    shared expert and the residual in one (:mod:`benchmarks.kernels.glue`);
    ``torch`` does each with torch ops (softmax, topk, sum, divide, casts: the step of
    the first sessions' figures). ``prepare`` (with ``fused`` glue): the linears whose
    input its producer hands over as FP8 rows (:class:`Fp8Rows`, one scale a row or for the
    tensor), that producer being the launch the step makes there anyway: the concatenation
    before ``fc``, the copy of the attention stand-in, a residual add, SiLU * up or the MoE
    sum (:mod:`benchmarks.kernels.producers`, ``glue.combine_quant``); ``qkv``'s
    producer is ``fc`` itself, so it always reads BF16 rows. With ``fused`` glue and
    ``side_shared`` the shared expert runs on a side stream beside the routed experts
    (:func:`beside`). ``mlp``: the shared expert on BF16 rows in one call (:func:`mlp_fn`).
    ``moe_rows`` (with ``fused`` glue, 2+ tokens): the residual add that writes the routed
    experts' input (and the shared expert's, with ``fuse_shared``) also hands them its FP8
    rows (``add_quant``), so that they quantize nothing themselves. ``routing``: the experts
    the MoE launches take, in place of those the step's routing picks (which still runs)."""
    fused = glue == "fused"
    if fused:
        from benchmarks.kernels import glue as triton_glue
        from benchmarks.kernels import moe as triton_moe
        from benchmarks.kernels import producers
        from mtpconv.kernels.triton_glue import silu_mul as fused_silu_mul
    act = fused_silu_mul if fused else silu_mul
    t = emb.shape[0]

    def kind(w: Linear | None) -> Prepared | None:
        return prepare(w, t) if fused and prepare is not None and w is not None else None

    def fp8(w: Linear | None) -> bool:  # FP8 rows with one scale each
        return kind(w) is Prepared.TOKEN

    def add(a: torch.Tensor, b: torch.Tensor, nxt: Linear | None) -> tuple[torch.Tensor, Any]:
        """``a + b``, and the next linear's input: the sum, or its FP8 rows."""
        k = kind(nxt)
        if k is not None:
            quant = producers.add_quant if k is Prepared.TOKEN else producers.add_quant_tensor
            total, q, sc = quant(a, b)
            return total, Fp8Rows(q, sc)
        total = a + b
        return total, total

    def silu_in(x: torch.Tensor, nxt: Linear) -> Any:
        return Fp8Rows(*producers.quant_act(x)) if fp8(nxt) else act(x)

    head = ws.head_full if full_head else ws.head_draft
    if s.fc_bf16:
        h = F.linear(torch.cat((emb, hid), dim=-1), ws.fc.bf16)
    else:
        x: Any = Fp8Rows(*producers.quant_cat(emb, hid)) if fp8(ws.fc) else torch.cat((emb, hid), dim=-1)
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
    o_out = lin(Fp8Rows(*producers.quant_per_token(attn)) if fp8(ws.o) else attn.contiguous(), ws.o)
    h_rows: Fp8Rows | None = None  # h's FP8 rows for the routed experts, from the add that writes h
    if (
        moe_rows
        and fused
        and s.experts
        and 1 < t <= triton_moe.GROUPED_MAX_TOKENS
        and kind(mlp_input) is None
    ):
        h, q, sc = producers.add_quant(h, o_out)
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


def step_bytes(s: Shape, ws: WeightSet, fp8: bool, full_head: bool, distinct: int) -> int:
    """Weight bytes one step must read, FP8 or BF16 (activations are negligible at these sizes)."""

    def lb(w: Linear) -> int:
        return w.fp8.numel() if fp8 else 2 * w.bf16.numel()

    fc = 2 * ws.fc.bf16.numel() if s.fc_bf16 else lb(ws.fc)
    total = fc + lb(ws.qkv) + lb(ws.o) + lb(ws.head_full if full_head else ws.head_draft)
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


def dense_shapes(s: Shape) -> dict[str, tuple[int, int]]:
    """The FP8 dense linears of one drafter step: name -> (N, K)."""
    h = s.hidden
    out = {} if s.fc_bf16 else {"fc": (h, 2 * h)}
    out |= {"qkv": (s.q_out + 2 * s.kv_out, h), "o": (h, s.o_in)}
    if s.experts == 0:
        out |= {"gate_up": (2 * s.intermediate, h), "down": (h, s.intermediate)}
    else:
        out |= {"shared_gate_up": (2 * s.shared_intermediate, h), "shared_down": (h, s.shared_intermediate)}
    out["head32k"] = (DRAFT_VOCAB, h)
    return out


def routing_sets(s: Shape, t: int, dev: torch.device, gen: torch.Generator, n: int = 8) -> list[torch.Tensor]:
    """``n`` random routings of ``t`` tokens (``[t, top_k]`` distinct experts each), to
    rotate so that the experts a sweep reads do not stay in L2."""
    return [
        torch.stack([torch.randperm(s.experts, device=dev, generator=gen)[: s.top_k] for _ in range(t)])
        for _ in range(n)
    ]
