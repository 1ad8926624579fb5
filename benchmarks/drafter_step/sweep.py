"""The sweep of the skinny GEMM's and the grouped MoE kernel's launch configurations on every
benchmarked drafter's shapes, and the tuning table its bests make."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import torch

from benchmarks.drafter_step.model import (
    L2_SAFE_BYTES,
    SHAPES,
    Experts,
    Linear,
    dense_shapes,
    routing_sets,
)
from benchmarks.drafter_step.timing import time_configs
from mtpconv.kernels import tuning


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


def time_skinny(x: torch.Tensor, ws: list[Linear], cfgs: list[Any], label: str) -> list[tuple[float, Any]]:
    """:func:`time_configs` of skinny-GEMM configurations: one linear on ``x`` over the
    weight copies ``ws``."""
    from mtpconv.kernels import triton_skinny

    def run(cfg: Any) -> None:
        for w in ws:
            triton_skinny.skinny_linear(x, w.fp8, w.scale, config=cfg)

    return time_configs(cfgs, run, len(ws), label)


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
    with it (:func:`benchmarks.kernels.moe.moe_projection`, as ``routed_experts`` runs
    a projection)."""
    from benchmarks.kernels import moe as triton_moe

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
    from benchmarks.kernels import moe as triton_moe

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
    from benchmarks.kernels import moe as triton_moe
    from mtpconv.kernels import triton_skinny

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


def retuned(srows: list[dict[str, Any]], sms: int, table: tuning.Tuning) -> tuning.Tuning:
    """``table`` with each swept dense shape's best configuration as its ``skinny`` entry (a best
    with K in fixed pieces other than one is reported and left out: the table cannot hold it)."""
    entries = dict(table.skinny)
    for r in srows:
        if r["rank"] != 0 or r["linear"].startswith("experts"):
            continue
        dot, bn, bk, warps, stages, programs, mma, tma, narrow, split, first = r["config"]
        if split > 1:
            print(f"  retune: {r['model']} {r['linear']} T={r['tokens']} is best with K in {split} "
                  "fixed pieces, which the table cannot hold: left as it is", flush=True)  # fmt: skip
            continue
        entries[(r["tokens"], r["n"], r["k"])] = tuning.Entry(
            dot, bn, bk, warps, stages, programs // sms, mma, tma, narrow, split, first
        )
    return dataclasses.replace(table, skinny=entries)


def table_json(table: tuning.Tuning) -> str:
    """``table`` as a tuning file (``mtpconv/kernels/tuned/*.json``), one entry a line."""

    def rows(entries: Mapping[tuning.Key, tuning.Entry]) -> str:
        lines = []
        for (tokens, n, k), e in sorted(entries.items()):
            fields = {"tokens": tokens, "n": n, "k": k, **e._asdict()}
            kept = {f: v for f, v in fields.items() if f not in ("split", "first_ahead") or v}
            lines.append("    " + json.dumps(kept))
        return "[\n" + ",\n".join(lines) + "\n  ]"

    keys = lambda ks: json.dumps(sorted(list(k) for k in ks))  # noqa: E731
    return (
        f'{{\n  "device": {json.dumps(table.device)},\n  "skinny": {rows(table.skinny)},\n'
        f'  "prepared": {rows(table.prepared)},\n  "skinny_token": {keys(table.skinny_token)},\n'
        f'  "scaled_mm_fused": {keys(table.scaled_mm_fused)}\n}}\n'
    )
