"""Experiment (nineteenth session, reverted): a persistent grouped MoE kernel at 2+ tokens,
on inputs prepared beforehand, timed beside ``triton_moe.moe_grouped``.

    python3 scripts/bench_moe_persistent.py check              # float64 reference (CUDA)
    PYTHONPATH=$PWD python3 scripts/bench_moe_persistent.py bench OUTDIR 4   # CUDA, side by side

Each program loops over (hit expert, N tile) work items, the K loop inside; with
``FLATTEN`` the loop nest is flattened (tl.range(..., flatten=True)) so the pipeline runs
across items.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # bench_draft

from mtpconv.kernels import pdl as pdl_setting  # noqa: E402
from mtpconv.kernels.triton_tile import pdl_enter, pdl_leave  # noqa: E402


@triton.jit
def _moe_persistent_kernel(
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
    HAS_SCALE: tl.constexpr,
    HAS_RW: tl.constexpr,
    X_SCALE: tl.constexpr,
    PAIRS_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GRID: tl.constexpr,
    FLATTEN: tl.constexpr,
    PDL: tl.constexpr,
    STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    pdl_enter(PDL)
    offs_p = tl.arange(0, PAIRS_PAD)
    all_ids = tl.load(ids_ptr + offs_p, mask=offs_p < PAIRS, other=-1)
    before = (all_ids[:, None] == all_ids[None, :]) & (offs_p[None, :] < offs_p[:, None])
    first = (tl.sum(before.to(tl.int32), axis=1) == 0) & (offs_p < PAIRS)
    rank = tl.cumsum(first.to(tl.int32), axis=0) - 1
    n_first = tl.sum(first.to(tl.int32), axis=0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    slots = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    for it in tl.range(pid, n_first * n_tiles, GRID, num_stages=STAGES, flatten=FLATTEN):
        j = it // n_tiles
        tile = it - j * n_tiles
        pair = tl.sum(tl.where(first & (rank == j), offs_p, 0), axis=0)
        expert = tl.sum(tl.where(offs_p == pair, all_ids, 0), axis=0)
        same = all_ids == expert
        pos = tl.cumsum(same.to(tl.int32), axis=0) - 1
        hit = same[None, :] & (pos[None, :] == slots[:, None])
        slot_pair = tl.sum(tl.where(hit, offs_p[None, :], 0), axis=1)
        valid = slots < tl.sum(same.to(tl.int32), axis=0)
        if X_PER_PAIR:  # noqa: SIM108
            rows = slot_pair
        else:
            rows = slot_pair // TOPK
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        w_ptrs = w_ptr + expert.to(tl.int64) * stride_we + offs_n[:, None] * stride_wn + offs_k[None, :]
        x_ptrs = x_ptr + rows[None, :] * stride_xm + offs_k[:, None]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for _k in range(0, K, BLOCK_K):
            w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0, eviction_policy="evict_first")
            xt = tl.load(x_ptrs, mask=valid[None, :], other=0.0)
            acc = tl.dot(w.to(xt.dtype), xt, acc)
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        if HAS_SCALE:
            acc = acc * tl.load(s_ptr + expert)
        if X_SCALE:
            acc = acc * tl.load(xs_ptr + rows, mask=valid, other=0.0)[None, :]
        if HAS_RW:
            acc = acc * tl.load(rw_ptr + slot_pair, mask=valid, other=0.0).to(tl.float32)[None, :]
        o_ptrs = o_ptr + slot_pair[None, :] * stride_om + offs_n[:, None]
        tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=mask_n[:, None] & valid[None, :])
    pdl_leave(PDL)


def sm_count(dev: torch.device) -> int:
    if dev.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(dev).multi_processor_count


def moe_persistent(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor | None,
    topk_ids: torch.Tensor,
    *,
    x_per_pair: bool,
    route_w: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: tuple[int, int, int, int, int, bool] = (64, 128, 4, 3, 2, True),
) -> torch.Tensor:
    """As ``moe_grouped`` on prepared inputs (FP8 rows with ``x_scale``, or BF16 rows)."""
    block_n, block_k, warps, stages, per_sm, flatten = config
    ids = topk_ids.reshape(-1)
    t, topk = topk_ids.shape
    pairs = ids.numel()
    _, n, k = w.shape
    assert k % block_k == 0 and x.shape[-1] == k
    out = torch.empty((pairs, n), dtype=out_dtype or x.dtype, device=x.device)
    grid = sm_count(x.device) * per_sm
    rw = route_w.reshape(-1).contiguous() if route_w is not None else ids
    _moe_persistent_kernel[(grid,)](
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
        HAS_SCALE=w_scale is not None,
        HAS_RW=route_w is not None,
        X_SCALE=x_scale is not None,
        PAIRS_PAD=triton.next_power_of_2(pairs),
        BLOCK_M=max(16, triton.next_power_of_2(t)),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GRID=grid,
        FLATTEN=flatten,
        STAGES=stages,
        num_warps=warps,
        num_stages=stages,
        **(pdl_setting.launch(x.device) if x.device.type == "cuda" else {"PDL": 0}),
    )
    return out


def check() -> None:
    """Against a float64 reference (interpreter on CPU, or CUDA)."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=dev).manual_seed(0)
    E, N, K, topk = 12, 96, 256, 3
    for t in (2, 4, 5):
        ids = torch.stack([torch.randperm(E, device=dev, generator=gen)[:topk] for _ in range(t)])
        e0 = int(ids[0, 0])
        ids[1] = torch.tensor([e0, (e0 + 1) % E, (e0 + 2) % E], device=dev)  # experts shared between tokens
        for fp8 in (False, True):
            wb = (torch.randn(E, N, K, device=dev, generator=gen) * 0.05).to(torch.bfloat16)
            for per_pair in (False, True):
                rows = t * topk if per_pair else t
                x = torch.randn(rows, K, device=dev, generator=gen).to(torch.bfloat16)
                rw = torch.rand(t, topk, device=dev, generator=gen).to(torch.bfloat16)
                if fp8:
                    ws = wb.float().abs().amax(dim=(1, 2)) / 448.0
                    w = (wb.float() / ws[:, None, None]).to(torch.float8_e4m3fn)
                    xs = x.float().abs().amax(dim=1) / 448.0
                    xq = (x.float() / xs[:, None]).to(torch.float8_e4m3fn)
                    wr = w.double() * ws.double()[:, None, None]
                    xr = xq.double() * xs.double()[:, None]
                else:
                    ws, xs, w, xq = None, None, wb, x
                    wr, xr = wb.double(), x.double()
                flat = ids.reshape(-1)
                ref = torch.empty(t * topk, N, dtype=torch.float64, device=dev)
                for p in range(t * topk):
                    xrow = xr[p if per_pair else p // topk]
                    ref[p] = wr[flat[p]] @ xrow * rw.reshape(-1)[p].double()
                for flatten in (False, True):
                    got = moe_persistent(
                        xq,
                        w,
                        ws,
                        ids,
                        x_per_pair=per_pair,
                        route_w=rw,
                        x_scale=xs,
                        out_dtype=torch.bfloat16,
                        config=(32, 64, 4, 2, 1, flatten),
                    )
                    err = (got.double() - ref).norm() / ref.norm()
                    print(f"t={t} fp8={fp8} per_pair={per_pair} flatten={flatten}: rel L2 {err:.2e}")
                    assert err < 1e-2, err


def bench(out: Path, tokens: list[int]) -> None:
    import bench_draft as bd

    from mtpconv.kernels import triton_moe
    from mtpconv.kernels.triton_quant import quant_per_token

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    res: list[dict[str, Any]] = []
    cfgs = [
        (bn, bk, w, st, ps, fl)
        for bn, bk, w, st in ((64, 128, 4, 3), (64, 256, 4, 4), (128, 128, 8, 3))
        for ps in (1, 2)
        for fl in (False, True)
    ]
    for key in ("qwen3.5-397b-a17b", "qwen3-next-80b-a3b"):
        s = bd.SHAPES[key]
        ex_gu = bd.Experts.make(s.experts, 2 * s.moe_intermediate, s.hidden, dev, gen)
        ex_dn = bd.Experts.make(s.experts, s.hidden, s.moe_intermediate, dev, gen)
        for t in tokens:
            id_sets = bd.routing_sets(s, t, dev, gen, 8)
            h = torch.randn(t, s.hidden, device=dev, generator=gen).to(torch.bfloat16)
            y = torch.randn(t * s.top_k, s.moe_intermediate, device=dev, generator=gen).to(torch.bfloat16)
            for proj, ex, x, per_pair in (("gate_up", ex_gu, h, False), ("down", ex_dn, y, True)):
                for fp8 in (True, False):
                    w, sc = (ex.fp8, ex.scale) if fp8 else (ex.bf16, None)
                    xq, xs = quant_per_token(x) if fp8 else (x, None)
                    n, k = w.shape[1:]
                    dflt = triton_moe.default_config(t, n, k, fp8, fp8_x=fp8)

                    def run_g(
                        cfg: Any,
                        w: Any = w,
                        sc: Any = sc,
                        xq: Any = xq,
                        xs: Any = xs,
                        per_pair: bool = per_pair,
                        id_sets: list[torch.Tensor] = id_sets,
                    ) -> None:
                        for ids in id_sets:
                            triton_moe.moe_grouped(
                                xq,
                                w,
                                sc,
                                ids,
                                x_per_pair=per_pair,
                                x_scale=xs,
                                out_dtype=torch.bfloat16,
                                config=cfg,
                            )

                    def run_p(
                        cfg: Any,
                        w: Any = w,
                        sc: Any = sc,
                        xq: Any = xq,
                        xs: Any = xs,
                        per_pair: bool = per_pair,
                        id_sets: list[torch.Tensor] = id_sets,
                    ) -> None:
                        for ids in id_sets:
                            moe_persistent(
                                xq,
                                w,
                                sc,
                                ids,
                                x_per_pair=per_pair,
                                x_scale=xs,
                                out_dtype=torch.bfloat16,
                                config=cfg,
                            )

                    label = f"{s.name} {proj} T={t} {'fp8' if fp8 else 'bf16'}"
                    g = bd.time_configs([dflt], run_g, len(id_sets), label)
                    p = bd.time_configs(cfgs, run_p, len(id_sets), label)
                    g2 = bd.time_configs([dflt], run_g, len(id_sets), label)
                    best = min(p) if p else (float("nan"), None)
                    flat_best = min((r for r in p if r[1][5]), default=(float("nan"), None))
                    row = {
                        "label": label,
                        "grouped": g[0][0],
                        "grouped_again": g2[0][0],
                        "best": best[0],
                        "best_cfg": best[1],
                        "best_flat": flat_best[0],
                        "flat_cfg": flat_best[1],
                        "all": [(u, c) for u, c in p],
                    }
                    print(
                        f"{label:<40} grouped {g[0][0]:6.2f}/{g2[0][0]:6.2f} us  persistent best "
                        f"{best[0]:6.2f} {best[1]}  flattened best {flat_best[0]:6.2f} {flat_best[1]}",
                        flush=True,
                    )
                    res.append(row)
                    out.mkdir(parents=True, exist_ok=True)
                    (out / "persist.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "check":
        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
        check()
    else:
        bench(Path(sys.argv[2]), [int(v) for v in sys.argv[3].split(",")])
