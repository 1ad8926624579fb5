"""Per-thread SASS instruction counts of the one-launch shared-expert kernel and of the grouped
MoE kernel at one token, compiled offline.

No GPU needed: the kernels (``mtpconv.kernels.triton_mlp._mlp_kernel``,
``mtpconv.kernels.triton_moe._moe_grouped_kernel``) are compiled for sm_90
with whatever Triton is importable (use the H200's, 3.6.0, in a venv of its own), with the
16-divisibility that Triton's launcher gives aligned pointers, strides and sizes, and
disassembled with the ``nvdisasm`` that Triton ships. The kernel is straight-line code
(its K steps unrolled), so the counts are per thread for one gate/up unit and one down tile::

    python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
    PYTHONPATH=/tmp/t36/lib/python3.11/site-packages:$PWD/.venv/lib/python3.11/site-packages:$PWD \\
        /tmp/t36/bin/python scripts/sass_counts.py

Prints, for 1, 2 and 4 tokens and each phase (both, gate/up only), the instruction count and
the opcodes that matter: FP32 arithmetic, conversions, shuffles, global loads, spills. Then, for
Qwen3.5-397B's routed experts at one token (FP8, the configurations ``moe_tuned`` gives), the
count, the index of the first weight load and the shuffles, with and without the routing
checks (``ONE_TOKEN``), and the down projection's counts with tiles whose threads split rows
more than K.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mtpconv.kernels import triton_mlp, triton_moe

ARGS = ["x_ptr", "gu_ptr", "gs_ptr", "dn_ptr", "ds_ptr", "act_ptr", "cnt_ptr", "o_ptr", "M", "H", "NI",
        "stride_xm", "stride_om"]  # fmt: skip
TYPES = ["*bf16", "*fp8e4nv", "*fp32", "*fp8e4nv", "*fp32", "*fp32", "*i64", "*bf16", "i32", "i32", "i32",
         "i32", "i32"]  # fmt: skip
OPS = ("FFMA", "FMUL", "FADD", "HADD2", "F2FP", "SHFL", "LDG", "STL", "LDL")


def sass(
    fn: Any,
    args: list[str],
    types: list[str],
    const: dict[str, Any],
    unaligned: set[str],
    options: dict[str, int],
) -> list[str]:
    """The SASS instructions of ``fn`` compiled for sm_90, with the 16-divisibility Triton's
    launcher gives every argument but ``unaligned``."""
    signature = dict(zip(args, types, strict=True)) | {k: "constexpr" for k in const}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(args) if name not in unaligned}
    kernel = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=const, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options=options,
    )
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    text = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    return [ln for ln in text.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", ln)]


def counts(tokens: int, phase: int, per_sm: int) -> tuple[int, dict[str, int]]:
    """Qwen3.5-397B's shared expert (H 4096, I 1024) as ``fused_mlp`` launches it on 132 SMs."""
    const = {
        "GU_ROW": False, "DN_ROW": False, "BLOCK_M": tokens, "BLOCK_I": 4, "BLOCK_K": 1024, "BLOCK_H": 16,
        "I_PAD": 1024, "PROGRAMS": 132 * per_sm, "PHASE": phase, "UNROLL": 4, "EVEN_H": True, "PDL": True,
        "ACT_FIRST": True,
    }  # fmt: skip
    options = {"num_warps": 4, "maxnreg": min(255, 65536 // (per_sm * 4 * 32)) // 8 * 8}
    lines = sass(triton_mlp._mlp_kernel, ARGS, TYPES, const, {"M"}, options)
    ops: dict[str, int] = {}
    for ln in lines:
        m = re.search(r"\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", ln)
        if m:
            ops[m.group(2)] = ops.get(m.group(2), 0) + 1
    return len(lines), {op: ops.get(op, 0) for op in OPS}


MOE_ARGS = ["x_ptr", "w_ptr", "s_ptr", "ids_ptr", "rw_ptr", "xs_ptr", "o_ptr", "N", "K", "TOPK", "PAIRS",
            "stride_xm", "stride_we", "stride_wn", "stride_om"]  # fmt: skip
MOE_TYPES = ["*bf16", "*fp8e4nv", "*fp32", "*i64", "*bf16", "*fp32", "*bf16", "i32", "i32", "i32", "i32",
             "i32", "i32", "i32", "i32"]  # fmt: skip


def moe_counts(down: bool, one_token: bool, tile: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
    """397B's FP8 routed experts at one token (10 routed + the shared expert: 11 pairs): the
    down projection (K 1024, route weights) or gate/up with SiLU * up (K 4096, ``glu``), as
    ``moe_grouped`` launches them, or with ``tile`` (BLOCK_N, BLOCK_K, warps); (instructions,
    index of the first weight load, shuffles)."""
    k = 1024 if down else 4096
    block_n, block_k, warps, stages, _ = triton_moe.default_config(1, 4096 if down else 2048, k, True)
    if tile is not None:
        block_n, block_k, warps = tile
    const = {
        "X_PER_PAIR": down, "ACT": False, "HAS_SCALE": True, "HAS_RW": down, "PAIRS_PAD": 16, "BLOCK_M": 1,
        "BLOCK_N": block_n, "BLOCK_K": block_k, "EVEN_K": True, "DOT": False, "FP8_MMA": False,
        "PDL": 2, "NARROW": True, "X_SCALE": False, "GLU": not down, "ONE_TOKEN": one_token,
    }  # fmt: skip
    unaligned = {"TOPK", "PAIRS"}
    options = {"num_warps": warps, "num_stages": stages}
    lines = sass(triton_moe._moe_grouped_kernel, MOE_ARGS, MOE_TYPES, const, unaligned, options)
    first = next(i for i, ln in enumerate(lines) if "LDG.E.EF" in ln)  # weights load evict-first
    return len(lines), first, sum("SHFL" in ln for ln in lines)


def main() -> None:
    print(f"triton {triton.__version__}")
    for tokens in (1, 2, 4):
        per_sm = 4 if tokens == 1 else 2  # triton_mlp.default_per_sm at H = 4096
        for phase, name in ((triton_mlp.BOTH, "both"), (triton_mlp.GATE_UP, "gate/up")):
            total, ops = counts(tokens, phase, per_sm)
            print(
                f"{tokens} token(s), {name:7}: {total:5} instructions; "
                + ", ".join(f"{k} {v}" for k, v in ops.items())
            )
    for down in (False, True):
        for one_token in (False, True):
            total, first, shuffles = moe_counts(down, one_token)
            name = "down" if down else "gate/up"
            checks = "without" if one_token else "with"
            print(
                f"MoE one token, {name:7} {checks:7} routing checks: {total:4} instructions, "
                f"first weight load {first}, {shuffles} shuffles"
            )
    for tile in ((32, 128, 2), (64, 64, 2), (64, 128, 4)):  # threads split rows more than K
        total, first, shuffles = moe_counts(True, True, tile)
        print(f"MoE one token, down, {tile[0]} x {tile[1]} tile, {tile[2]} warps: {total:4} instructions, "
              f"{shuffles} shuffles")  # fmt: skip


if __name__ == "__main__":
    main()
