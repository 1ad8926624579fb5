"""The step's variants: which kernels a drafter step runs, named on the command line.

A variant is ``bf16``, ``auto`` (each linear on the kernel ``fp8_linear`` picks for it) or an
FP8 linear kernel's name (:data:`mtpconv.kernels.KERNELS`), with modifiers (``auto+nomlp``,
``bf16+noshared``): see :func:`variant_parts`. Candidate launch configurations go in through
Python (:func:`mtpconv.kernels.tuning.replaced`, :func:`benchmarks.kernels.moe_tuned.one_token_fp8`),
never through an environment switch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.drafter_step.model import (
    Experts,
    Fp8Rows,
    Linear,
    LinearFn,
    MlpFn,
    MoeFn,
    PrepareFn,
    Routing,
    Shape,
    WeightSet,
    silu_mul,
    step,
)
from benchmarks.kernels import moe_tuned
from benchmarks.kernels.prepared import prepared_linear, takes_prepared
from mtpconv.kernels import fp8_linear, fp8_mlp, kernel_named, pdl, tuning

AUTO = "auto"  # the variant whose linears take fp8_linear's own choice of kernel


@dataclass(frozen=True)
class Variant:
    """What one variant of the step runs (:func:`variant_parts` reads it from its name)."""

    path: str  # an FP8 linear kernel's name, ``auto`` or ``bf16``
    env: dict[str, str] = field(default_factory=dict)  # product settings (MTPCONV_PDL, ...) while captured
    shared: bool = True  # the shared expert inside the grouped MoE launches (the default)
    fused: bool = False  # the grouped MoE kernel prepares its inputs itself (steps until the ninth session)
    noprep: bool = False  # dense linears always read BF16 rows (the steps until the tenth session)
    side: bool = False  # the shared expert on a side stream beside the routed ones (as vLLM runs it)
    nomlp: bool = False  # the auto step's shared expert in three launches (steps until the twelfth session)
    moe_rows: bool = False  # the routed experts' FP8 rows from the residual add (step's moe_rows)
    noglu: bool = False  # one token: the down projection applies SiLU * up (the steps until the 15th session)
    own_route: bool = False  # the MoE takes the variant's own top-k (the steps until the 20th session)
    # one-token narrow-GEMV entries in place of the table's: {(N, K): Entry}
    gemv_one_token: dict[tuple[int, int], tuning.Entry] = field(default_factory=dict)
    # FP8 experts' one-token configurations in place of the measured ones: {K: config}
    moe_one_token: dict[int, moe_tuned.Config] = field(default_factory=dict)


def _gemv_entries(text: str) -> dict[tuple[int, int], tuning.Entry]:
    """``NxK:ROWSxBLOCK_KxWARPS[xFIRST_AHEAD[xWAVES]]`` entries separated by ``;`` (first_ahead 0
    and 4 resident programs an SM where left out) as narrow-GEMV entries."""
    named: dict[tuple[int, int], tuning.Entry] = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        shape, _, fields = entry.partition(":")
        try:
            n, k = (int(v) for v in shape.split("x"))
            parts = [int(v) for v in fields.split("x")]
            if not 3 <= len(parts) <= 5 or min(parts) < 0 or min(parts[:3]) == 0:
                raise ValueError
        except ValueError:
            form = "NxK:ROWSxBLOCK_KxWARPS[xFIRST_AHEAD[xWAVES]]"
            raise ValueError(f"+gemv1: {entry!r} is not {form}") from None
        rows, block_k, warps, first, waves = parts + [0, 4][len(parts) - 3 :]
        entry_ = tuning.Entry(False, rows, block_k, warps, 3, waves, 0, False, True, 0, first)
        named.setdefault((n, k), entry_)
    return named


def _moe_configs(text: str) -> dict[int, moe_tuned.Config]:
    """``K:BNxBKxWARPS[xSTAGESxMODE]`` entries separated by ``;`` (stages 3 and the narrow-load
    FMA where left out)."""
    named: dict[int, moe_tuned.Config] = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        key, _, fields = entry.partition(":")
        try:
            k = int(key)
            parts = [int(f) for f in fields.split("x")]
            if len(parts) not in (3, 5) or min(parts) < 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"+moe1: {entry!r} is not K:BNxBKxWARPS or K:BNxBKxWARPSxSTAGESxMODE") from None
        bn, bk, warps, stages, mode = parts + ([3, moe_tuned.FMA_NARROW] if len(parts) == 3 else [])
        named.setdefault(k, (bn, bk, warps, stages, mode))
    return named


def variant_parts(variant: str) -> Variant:
    """``path[+nopdl|+pdl|+late][+noshared][+fused][+noprep][+side][+nomlp][+moerows][+noglu]``
    ``[+ownroute][+gemv1=...][+moe1=...][+KEY=VALUE...]``: the path (an FP8 linear kernel's
    name, ``auto`` or ``bf16``) and how the step runs around it. ``+pdl`` / ``+late`` launch the
    Triton kernels with programmatic dependent launch, dependents let in after the wait / after
    the main loop; ``+nopdl`` without (``MTPCONV_PDL``). By default a MoE step's shared expert is
    one more expert of the grouped MoE launches, which every token picks with its sigmoid gate
    as the routing weight; ``+noshared``: in launches of its own after the routed ones
    (``+shared`` names the default). ``+fused``: at 2+ tokens the grouped kernel applies SiLU *
    up itself and FP8 experts quantize each token's K tile in registers, where by default a
    launch of its own prepares each projection's input. ``+noprep``: the ``auto`` step's dense
    linears read BF16 rows, where by default the producer of an input hands it FP8 rows wherever
    :func:`benchmarks.kernels.prepared.takes_prepared` says so. ``+side`` (the shared expert on a
    side stream, as vLLM runs it) and ``+nomlp`` (the ``auto`` step's shared expert in three
    launches rather than :func:`mtpconv.kernels.fp8_mlp`) imply ``+noshared``. ``+moerows``: at 2+
    tokens the residual add that writes the routed experts' input also hands them its FP8 rows.
    ``+noglu``: at one token the routed down projection applies SiLU * up. ``+ownroute``: the MoE
    launches take the experts the variant's own routing picks, where by default they take those
    the BF16 step picks (:func:`bf16_routing`). ``+gemv1=NxK:ROWSxBLOCK_KxWARPS[xFIRST[xWAVES]];...``:
    one-token narrow-GEMV entries in place of the tuning table's; ``+moe1=K:BNxBKxWARPS[xSTAGESxMODE];...``:
    the FP8 experts' one-token configurations; ``+KEY=VALUE``: the product setting ``MTPCONV_KEY``
    (``FUSED_MLP``, ``PDL``, ``DISABLED_KERNELS``) while the variant's graphs are captured."""
    base, *mods = variant.split("+")
    env: dict[str, str] = {}
    flags: dict[str, bool] = {}
    gemv: dict[tuple[int, int], tuning.Entry] = {}
    moe: dict[int, moe_tuned.Config] = {}
    shared: bool | None = None  # None: the default, in the grouped launches
    names = {"fused": "fused", "noprep": "noprep", "side": "side", "nomlp": "nomlp", "moerows": "moe_rows",
             "noglu": "noglu", "ownroute": "own_route"}  # fmt: skip
    for mod in mods:
        if mod in ("nopdl", "pdl", "late"):
            env[pdl.ENV] = {"nopdl": "0", "pdl": "1", "late": "late"}[mod]
        elif mod in ("shared", "noshared"):
            if shared is not None:
                raise ValueError(f"+shared and +noshared both in {variant!r}")
            shared = mod == "shared"
        elif mod in names:
            flags[names[mod]] = True
        elif mod.startswith("gemv1="):
            gemv.update(_gemv_entries(mod.partition("=")[2]))
        elif mod.startswith("moe1="):
            moe.update(_moe_configs(mod.partition("=")[2]))
        elif "=" in mod:  # KEY=VALUE: the product setting MTPCONV_KEY while the graphs are captured
            key, value = mod.split("=", 1)
            env[f"MTPCONV_{key}"] = value
        else:
            raise ValueError(f"unknown variant modifier {mod!r} in {variant!r}")
    own_launches = flags.get("side", False) or flags.get("nomlp", False)
    if shared and own_launches:
        raise ValueError(f"{variant!r}: +side and +nomlp need the shared expert's own launches")
    if base not in ("bf16", AUTO):
        kernel_named(base)  # ValueError naming the kernels
    in_grouped = not own_launches if shared is None else shared
    return Variant(base, env, in_grouped, gemv_one_token=gemv, moe_one_token=moe, **flags)


def is_bf16(variant: str) -> bool:
    return variant_parts(variant).path == "bf16"


@contextlib.contextmanager
def variant_settings(variant: str) -> Iterator[None]:
    """The variant's product settings, tuning-table entries and expert configurations while its
    graphs are captured."""
    parts = variant_parts(variant)
    old = {k: os.environ.get(k) for k in parts.env}
    os.environ.update(parts.env)
    table = tuning.for_device()
    if parts.gemv_one_token:
        entries = {(1, n, k): e for (n, k), e in parts.gemv_one_token.items()}
        table = dataclasses.replace(table, skinny={**table.skinny, **entries})
    try:
        replaced = tuning.replaced(table) if parts.gemv_one_token else contextlib.nullcontext()
        with replaced, moe_tuned.one_token_fp8(parts.moe_one_token):
            yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def linear_fn(variant: str) -> LinearFn:
    path = variant_parts(variant).path
    if path == "bf16":
        return lambda x, w: F.linear(x, w.bf16)
    if path == AUTO:  # one weight scale per linear here

        def auto(x: Any, w: Linear) -> torch.Tensor:
            if isinstance(x, Fp8Rows):
                return prepared_linear(x.q, w.fp8, w.scale, None, x_scale=x.scale, out_dtype=torch.bfloat16)
            return fp8_linear(x, w.fp8, w.scale)

        return auto
    kernel = kernel_named(path)
    return lambda x, w: fp8_linear(x, w.fp8, w.scale, kernel=kernel)


def prepare_fn(variant: str) -> PrepareFn | None:
    """The ``auto`` step's choice of which linears get FP8 rows from their producer (none for
    other variants and ``+noprep``)."""
    parts = variant_parts(variant)
    if parts.path != AUTO or parts.noprep:
        return None
    return lambda w, t: takes_prepared(t, *w.fp8.shape)


def mlp_fn(variant: str) -> MlpFn | None:
    """The ``auto`` step's shared expert in one call, :func:`mtpconv.kernels.fp8_mlp` (one
    launch at 1-4 tokens where it can; its three launches elsewhere); None for other variants
    and ``+nomlp``."""
    parts = variant_parts(variant)
    if parts.path != AUTO or parts.nomlp:
        return None
    return lambda x, gu, dn: fp8_mlp(x, gu.fp8, gu.scale, dn.fp8, dn.scale)


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
    from benchmarks.kernels import moe as triton_moe
    from benchmarks.kernels import moe_pairs as triton_moe_pairs

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
    with variant_settings("bf16"):
        _, ids = step(s, ws, emb, hid, linear_fn("bf16"), moe_fn("bf16", "grouped"),
                      False, variant_parts("bf16").shared, glue)  # fmt: skip
    assert ids is not None
    return Routing.of(ids, s.experts)


def fp8_variants(paths: list[str]) -> list[str]:
    return [p for p in paths if p != "bf16"]  # "bf16+..." variants are listed as their own columns
