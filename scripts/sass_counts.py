"""Per-thread SASS instruction counts of the one-launch shared-expert kernel, compiled offline.

No GPU needed: the kernel (``mtpconv.kernels.triton_mlp._mlp_kernel``) is compiled for sm_90
with whatever Triton is importable (use the H200's, 3.6.0, in a venv of its own), with the
16-divisibility that Triton's launcher gives aligned pointers, strides and sizes, and
disassembled with the ``nvdisasm`` that Triton ships. The kernel is straight-line code
(its K steps unrolled), so the counts are per thread for one gate/up unit and one down tile::

    python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
    PYTHONPATH=/tmp/t36/lib/python3.11/site-packages:$PWD/.venv/lib/python3.11/site-packages:$PWD \\
        /tmp/t36/bin/python scripts/sass_counts.py

Prints, for 1, 2 and 4 tokens and each phase (both, gate/up only), the instruction count and
the opcodes that matter: FP32 arithmetic, conversions, shuffles, global loads, spills.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mtpconv.kernels import triton_mlp

ARGS = ["x_ptr", "gu_ptr", "gs_ptr", "dn_ptr", "ds_ptr", "act_ptr", "cnt_ptr", "o_ptr", "M", "H", "NI",
        "stride_xm", "stride_om"]  # fmt: skip
TYPES = ["*bf16", "*fp8e4nv", "*fp32", "*fp8e4nv", "*fp32", "*fp32", "*i64", "*bf16", "i32", "i32", "i32",
         "i32", "i32"]  # fmt: skip
OPS = ("FFMA", "FMUL", "FADD", "HADD2", "F2FP", "SHFL", "LDG", "STL", "LDL")


def counts(tokens: int, phase: int, per_sm: int) -> tuple[int, dict[str, int]]:
    """Qwen3.5-397B's shared expert (H 4096, I 1024) as ``fused_mlp`` launches it on 132 SMs."""
    const = {
        "GU_ROW": False, "DN_ROW": False, "BLOCK_M": tokens, "BLOCK_I": 4, "BLOCK_K": 1024, "BLOCK_H": 16,
        "I_PAD": 1024, "PROGRAMS": 132 * per_sm, "PHASE": phase, "UNROLL": 4, "EVEN_H": True, "PDL": True,
        "ACT_FIRST": True,
    }  # fmt: skip
    signature = dict(zip(ARGS, TYPES, strict=True)) | {k: "constexpr" for k in const}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(ARGS) if name != "M"}
    kernel = triton.compile(
        ASTSource(fn=triton_mlp._mlp_kernel, signature=signature, constexprs=const, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 4, "maxnreg": min(255, 65536 // (per_sm * 4 * 32)) // 8 * 8},
    )
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    lines = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", ln)]
    ops: dict[str, int] = {}
    for ln in lines:
        m = re.search(r"\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", ln)
        if m:
            ops[m.group(2)] = ops.get(m.group(2), 0) + 1
    return len(lines), {op: ops.get(op, 0) for op in OPS}


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


if __name__ == "__main__":
    main()
