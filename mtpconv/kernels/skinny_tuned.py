"""Per-shape launch configurations of the skinny GEMM, measured on the H200.

Source: ``PYTHONPATH=$PWD python3 scripts/bench_draft.py --out $OUT/fin --sweep --retune
--micro --tokens 1,4,16 --variants bf16,wo_skinny`` (docs/BENCHMARKS.md, issue 12, the
narrow-load GEMV session): the best configuration of that sweep for each dense FP8 linear
of the benchmarked drafters, as ``--retune`` printed them. Keys are ``(tokens, N, K)``
with tokens 1, 4 (for 2-4) or 16 (for 5-16); values ``(dot, block_n, block_k, warps,
stages, waves, mma, tma, narrow)`` with ``waves`` resident programs per SM. Shapes not
listed take the rule in :func:`mtpconv.kernels.triton_skinny.default_config`.

Entries marked ``(8th)`` come from the eighth session's sweep of the narrow-load GEMV's
configurations, now with 2 warps and 512-wide K steps too, against each shape's entry
before: ``bench_draft.py --sweep --retune --narrow-only --sweep-models ... --sweep-tokens
...`` (docs/BENCHMARKS.md, eighth session).
"""

from __future__ import annotations

import functools
import os

Entry = tuple[bool, int, int, int, int, int, int, bool, bool]  # a TUNED value

TUNED: dict[tuple[int, int, int], Entry] = {
    (1, 1024, 2048): (False, 2, 2048, 8, 3, 4, 0, False, True),  # Qwen3-Next-80B shared_gate_up, 0.80 TB/s
    (1, 2048, 512): (False, 4, 512, 4, 3, 4, 0, False, False),  # Qwen3-Next-80B shared_down, 0.49 TB/s
    (1, 2048, 4096): (False, 2, 1024, 4, 3, 4, 0, False, True),  # Qwen3.5-397B shared_gate_up, 1.78 TB/s
    (1, 4096, 1024): (False, 4, 512, 4, 3, 8, 0, False, False),  # Qwen3.5-397B shared_down, 1.26 TB/s
    (1, 4096, 8192): (False, 8, 2048, 8, 3, 4, 0, False, True),  # Qwen3.5-397B fc, 3.06 TB/s
    (1, 5120, 6144): (False, 4, 1024, 4, 3, 4, 0, False, True),  # Qwen3.5-27B o, 3.33 TB/s (FIRST_AHEAD)
    (1, 5120, 10240): (False, 8, 2048, 8, 3, 4, 0, False, True),  # Qwen3.5-27B fc, 3.43 TB/s
    (1, 5120, 17408): (False, 8, 1024, 4, 3, 4, 0, False, True),  # Qwen3.5-27B down, 3.60 TB/s (ONE_PIECE)
    (1, 9216, 2048): (False, 8, 1024, 4, 3, 16, 0, False, True),  # Qwen3-Next-80B qkv, 2.74 TB/s (8th)
    (1, 14336, 5120): (False, 8, 512, 2, 3, 8, 0, False, True),  # Qwen3.5-27B qkv, 3.60 TB/s (8th)
    (1, 17408, 4096): (False, 8, 1024, 4, 3, 16, 0, False, True),  # Qwen3.5-397B qkv, 3.53 TB/s (8th)
    (1, 32768, 2048): (False, 8, 512, 2, 3, 16, 0, False, True),  # Qwen3-Next-80B head32k, 3.53 TB/s (8th)
    (1, 32768, 4096): (False, 8, 2048, 8, 3, 12, 0, False, True),  # Qwen3.5-397B head32k, 3.84 TB/s (8th)
    (1, 32768, 5120): (False, 2, 512, 2, 3, 4, 0, False, True),  # Qwen3.5-27B head32k, 3.90 TB/s (8th)
    (1, 34816, 5120): (False, 8, 512, 2, 3, 4, 0, False, True),  # Qwen3.5-27B gate_up, 4.01 TB/s (8th)
    (4, 1024, 2048): (False, 2, 1024, 4, 3, 4, 0, False, True),  # Qwen3-Next-80B shared_gate_up, 0.58 TB/s
    (4, 2048, 512): (False, 4, 1024, 4, 3, 16, 0, False, True),  # Qwen3-Next-80B shared_down, 0.30 TB/s
    (4, 2048, 4096): (False, 4, 1024, 4, 3, 4, 0, False, True),  # Qwen3.5-397B shared_gate_up, 1.26 TB/s
    (4, 4096, 1024): (False, 8, 1024, 4, 3, 4, 0, False, True),  # Qwen3.5-397B shared_down, 0.75 TB/s
    (4, 4096, 8192): (True, 64, 256, 4, 3, 2, 2, True, False),  # Qwen3.5-397B fc, 2.36 TB/s
    (4, 5120, 6144): (True, 128, 128, 4, 4, 2, 2, True, False),  # Qwen3.5-27B o, 2.36 TB/s
    (4, 5120, 10240): (True, 64, 256, 4, 4, 2, 2, True, False),  # Qwen3.5-27B fc, 2.69 TB/s
    (4, 5120, 17408): (True, 64, 256, 4, 4, 2, 2, True, False),  # Qwen3.5-27B down, 3.12 TB/s
    (4, 9216, 2048): (True, 64, 128, 8, 3, 8, 2, False, False),  # Qwen3-Next-80B qkv, 1.40 TB/s
    (4, 14336, 5120): (True, 64, 128, 4, 3, 4, 2, False, False),  # Qwen3.5-27B qkv, 2.66 TB/s
    (4, 17408, 4096): (True, 128, 128, 4, 3, 2, 2, True, False),  # Qwen3.5-397B qkv, 2.55 TB/s
    (4, 32768, 2048): (True, 64, 128, 4, 4, 4, 2, False, False),  # Qwen3-Next-80B head32k, 3.25 TB/s
    (4, 32768, 4096): (True, 64, 128, 4, 4, 4, 2, False, False),  # Qwen3.5-397B head32k, 3.56 TB/s
    (4, 32768, 5120): (True, 128, 128, 4, 4, 2, 2, True, False),  # Qwen3.5-27B head32k, 3.66 TB/s
    (4, 34816, 5120): (True, 128, 128, 4, 3, 2, 2, True, False),  # Qwen3.5-27B gate_up, 3.17 TB/s
    (16, 1024, 2048): (True, 32, 256, 4, 4, 2, 2, False, False),  # Qwen3-Next-80B shared_gate_up, 0.36 TB/s
    (16, 2048, 512): (True, 32, 256, 4, 4, 4, 2, False, False),  # Qwen3-Next-80B shared_down, 0.22 TB/s
    (16, 2048, 4096): (True, 64, 256, 4, 4, 2, 2, False, False),  # Qwen3.5-397B shared_gate_up, 0.99 TB/s
    (16, 4096, 1024): (True, 64, 256, 4, 4, 2, 2, False, False),  # Qwen3.5-397B shared_down, 0.64 TB/s
    (16, 4096, 8192): (True, 64, 256, 4, 3, 2, 2, True, False),  # Qwen3.5-397B fc, 2.30 TB/s
    (16, 5120, 6144): (True, 64, 128, 4, 4, 4, 2, False, False),  # Qwen3.5-27B o, 2.23 TB/s
    (16, 5120, 10240): (True, 64, 128, 4, 3, 4, 2, False, False),  # Qwen3.5-27B fc, 2.59 TB/s
    (16, 5120, 17408): (True, 64, 256, 4, 4, 2, 2, True, False),  # Qwen3.5-27B down, 3.02 TB/s
    (16, 9216, 2048): (True, 64, 128, 8, 3, 8, 2, False, False),  # Qwen3-Next-80B qkv, 1.39 TB/s
    (16, 14336, 5120): (True, 64, 128, 4, 3, 4, 2, False, False),  # Qwen3.5-27B qkv, 2.39 TB/s
    (16, 17408, 4096): (True, 64, 256, 4, 3, 2, 2, True, False),  # Qwen3.5-397B qkv, 2.39 TB/s
    (16, 32768, 2048): (True, 64, 128, 4, 4, 4, 2, False, False),  # Qwen3-Next-80B head32k, 3.22 TB/s
    (16, 32768, 4096): (True, 64, 128, 4, 4, 4, 2, False, False),  # Qwen3.5-397B head32k, 3.55 TB/s
    (16, 32768, 5120): (True, 128, 128, 4, 4, 2, 2, True, False),  # Qwen3.5-27B head32k, 3.64 TB/s
    (16, 34816, 5120): (True, 64, 128, 4, 3, 4, 2, False, False),  # Qwen3.5-27B gate_up, 2.99 TB/s
}

# Entries of TUNED that run each tile's K range in one program (``Config.split`` 1) rather
# than cut to fill the waves: the best of the fourteenth session's one-token sweep, which
# tried one and two pieces beside the waves' cut (``bench_draft.py --sweep-only --narrow-only
# --sweep-models qwen3.5-27b --sweep-tokens 1 --tokens 1``; docs/BENCHMARKS.md): 27B's down
# 24.8 us against 28.0 with the entry before; on its other linears one piece was within 0.4 us.
ONE_PIECE: frozenset[tuple[int, int, int]] = frozenset({(1, 5120, 17408)})

# Entries of TUNED whose narrow GEMV loads its first K step's weight tile before the PDL wait
# (``Config.first_ahead``): that tile is on its way while the kernel before ends. Sixteenth
# session (``scripts/sweep_gemv_first.py --n 5120 --k 6144 --modes late``; docs/BENCHMARKS.md):
# 27B's o read at 3.33 TB/s with 4-row tiles and the tile ahead, against 3.20 with 8-row tiles
# (the entry before) and 3.26 with 8-row tiles and the tile ahead; two tiles ahead, 3.27-3.29.
# On the other one-token GEMV shapes the tile ahead moved a linear alone by -12% to +7%
# (``scripts/bench_gemv_ahead.py --tokens 1,4``) and no drafter step by more than its spread
# (``bench_draft.py --variants bf16,auto,...`` with every GEMV so launched), so only o takes it.
FIRST_AHEAD: dict[tuple[int, int, int], int] = {(1, 5120, 6144): 1}

# One-token narrow-GEMV configurations in place of the table's, for timing a candidate inside a
# whole drafter step (``bench_draft.py`` variant ``auto+GEMV_ONE_TOKEN=...``,
# ``scripts/sweep_gemv_step.py``): ``NxK:ROWSxBLOCK_KxWARPS[xFIRST_AHEAD[xWAVES]]`` entries
# separated by ``;`` (first_ahead 0 and 4 resident programs an SM where left out)
ONE_TOKEN_ENV = "MTPCONV_GEMV_ONE_TOKEN"


def one_token_override(n: int, k: int) -> tuple[Entry, int] | None:
    """The narrow-GEMV entry and ``first_ahead`` that ``MTPCONV_GEMV_ONE_TOKEN`` names for an
    ``N x K`` linear at one token, or None; a malformed value raises ``ValueError`` naming the
    setting. Called on every one-token launch without a config: the value is parsed once."""
    return _named_one_token(os.environ.get(ONE_TOKEN_ENV, "")).get((n, k))


@functools.lru_cache(maxsize=8)
def _named_one_token(value: str) -> dict[tuple[int, int], tuple[Entry, int]]:
    """``{(N, K): (entry, first_ahead)}`` that a ``MTPCONV_GEMV_ONE_TOKEN`` value names (the
    first entry for a shape wins)."""
    named: dict[tuple[int, int], tuple[Entry, int]] = {}
    for text in filter(None, (e.strip() for e in value.split(";"))):
        shape, _, fields = text.partition(":")
        try:
            entry_n, entry_k = (int(v) for v in shape.split("x"))
            parts = [int(v) for v in fields.split("x")]
            if not 3 <= len(parts) <= 5 or min(parts) < 0 or min(parts[:3]) == 0:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"{ONE_TOKEN_ENV}: {text!r} is not NxK:ROWSxBLOCK_KxWARPS[xFIRST_AHEAD[xWAVES]]"
            ) from None
        rows, block_k, warps, first, waves = parts + [0, 4][len(parts) - 3 :]
        named.setdefault((entry_n, entry_k), (narrow_entry(rows, block_k, warps, waves), first))
    return named


def narrow_entry(rows: int, block_k: int, warps: int, waves: int) -> Entry:
    """The narrow-GEMV entry that a ``MTPCONV_GEMV_ONE_TOKEN`` entry stands for."""
    return (False, rows, block_k, warps, 3, waves, 0, False, True)


def one_token_setting(entries: dict[tuple[int, int], tuple[Entry, int]]) -> str | None:
    """``MTPCONV_GEMV_ONE_TOKEN``'s value naming ``{(N, K): (entry, first_ahead)}`` at one token
    (what :func:`one_token_override` reads back), or None where an entry is not one it can name."""
    if any(e != narrow_entry(e[1], e[2], e[3], e[5]) for e, _ in entries.values()):
        return None
    return ";".join(f"{n}x{k}:{e[1]}x{e[2]}x{e[3]}x{first}x{e[5]}" for (n, k), (e, first) in entries.items())


def tuned_entry(key: tuple[int, int, int]) -> tuple[Entry, int] | None:
    """The entry for ``key`` (token bucket, N, K) and its ``first_ahead``: the one
    ``MTPCONV_GEMV_ONE_TOKEN`` names at one token, else the table's; None where neither has one."""
    override = one_token_override(key[1], key[2]) if key[0] == 1 else None
    if override is not None:
        return override
    entry = TUNED.get(key)
    return None if entry is None else (entry, FIRST_AHEAD.get(key, 0))


# FP8 activations prepared before the launch (``skinny_linear(x_scale=...)``, ``mma`` 3), each
# tile's K range in one program (``triton_skinny.prepared_config``): the best of
# ``scripts/bench_paths.py --prepared --splits --tokens 4,16`` (docs/BENCHMARKS.md, issue 12,
# fourteenth session: 64-128 x 128-256 tiles, 3-6 stages, TMA or not, K in 1, 2 or 4 pieces;
# one piece won on every shape) where it beat ``fp8_linear``'s own path on BF16 rows, the
# activation's quantization left to its producer. us prepared / own path (/ cuBLAS on per-tensor
# FP8 rows, the path these shapes took before, where that was the step's):
TUNED_PREPARED: dict[tuple[int, int, int], Entry] = {
    (4, 2048, 512): (True, 64, 128, 4, 6, 1, 3, False, False),  # Qwen3-Next-80B shared_down: 2.1 / 3.3
    (4, 2048, 4096): (True, 64, 256, 4, 6, 1, 3, True, False),  # 397B shared_gate_up, Next fc, o: 5.5 / 6.5
    (4, 4096, 1024): (True, 64, 256, 4, 6, 1, 3, False, False),  # Qwen3.5-397B shared_down: 3.1 / 5.1
    (4, 4096, 8192): (True, 64, 256, 4, 6, 1, 3, False, False),  # Qwen3.5-397B fc, o: 11.1 / 14.8
    (4, 5120, 6144): (True, 64, 256, 4, 6, 1, 3, False, False),  # Qwen3.5-27B o: 9.8 / 13.2
    (4, 5120, 10240): (True, 64, 256, 4, 6, 1, 3, False, False),  # Qwen3.5-27B fc: 15.5 / 18.7
    (4, 5120, 17408): (True, 64, 256, 4, 6, 1, 3, False, False),  # Qwen3.5-27B down: 24.0 / 28.0
    (4, 9216, 2048): (True, 128, 256, 4, 5, 1, 3, True, False),  # Qwen3-Next-80B qkv: 6.7 / 9.7 / 7.7
    (4, 14336, 5120): (True, 128, 256, 4, 4, 1, 3, True, False),  # Qwen3.5-27B qkv: 19.7 / 23.3 / 20.6
    (4, 17408, 4096): (True, 64, 256, 4, 3, 1, 3, True, False),  # Qwen3.5-397B qkv: 19.4 / 24.0 / 21.8
    (4, 32768, 2048): (True, 128, 256, 4, 3, 1, 3, True, False),  # Qwen3-Next-80B head32k: 18.1 / 19.8
    (4, 32768, 4096): (True, 128, 256, 4, 3, 1, 3, True, False),  # Qwen3.5-397B head32k: 33.9 / 37.0
    (4, 32768, 5120): (True, 128, 256, 4, 3, 1, 3, True, False),  # Qwen3.5-27B head32k: 41.7 / 45.2
    (4, 34816, 5120): (True, 64, 256, 4, 3, 1, 3, False, False),  # Qwen3.5-27B gate_up: 45.3 / 51.0 / 48.5
    (16, 1024, 2048): (True, 64, 256, 4, 6, 1, 3, False, False),  # Qwen3-Next-80B shared_gate_up: 3.5 / 5.3
    (16, 2048, 512): (True, 64, 256, 4, 3, 1, 3, False, False),  # Qwen3-Next-80B shared_down: 2.3 / 4.3
    (16, 2048, 4096): (True, 64, 256, 4, 6, 1, 3, True, False),  # 397B shared_gate_up, Next fc, o: 5.5 / 7.8
    (16, 4096, 1024): (True, 64, 256, 4, 6, 1, 3, False, False),  # Qwen3.5-397B shared_down: 3.3 / 5.7
    (16, 4096, 8192): (True, 64, 256, 4, 6, 1, 3, True, False),  # Qwen3.5-397B fc, o: 11.1 / 15.2
    (16, 5120, 6144): (True, 64, 256, 4, 6, 1, 3, False, False),  # Qwen3.5-27B o: 9.7 / 14.1
    (16, 5120, 10240): (True, 64, 256, 4, 6, 1, 3, True, False),  # Qwen3.5-27B fc: 15.6 / 20.6
    (16, 5120, 17408): (True, 64, 256, 4, 6, 1, 3, False, False),  # Qwen3.5-27B down: 24.4 / 29.2
    (16, 9216, 2048): (True, 128, 256, 4, 5, 1, 3, True, False),  # Qwen3-Next-80B qkv: 6.8 / 10.8 / 7.7
    (16, 14336, 5120): (True, 128, 256, 4, 4, 1, 3, True, False),  # Qwen3.5-27B qkv: 20.3 / 26.6 / 21.1
    (16, 17408, 4096): (True, 64, 256, 4, 3, 1, 3, True, False),  # Qwen3.5-397B qkv: 19.6 / 25.2 / 21.4
    (16, 32768, 2048): (True, 64, 128, 4, 4, 1, 3, False, False),  # Qwen3-Next-80B head32k: 18.5 / 20.3
    (16, 32768, 4096): (True, 128, 256, 4, 3, 1, 3, True, False),  # Qwen3.5-397B head32k: 34.0 / 37.8
    (16, 32768, 5120): (True, 128, 256, 4, 3, 1, 3, True, False),  # Qwen3.5-27B head32k: 42.0 / 45.5
    (16, 34816, 5120): (True, 64, 256, 4, 3, 1, 3, False, False),  # Qwen3.5-27B gate_up: 46.1 / 53.2 / 49.2
}

# Shapes on which fp8_linear, handed BF16 rows at 2-16 tokens, quantizes them per token
# itself and makes the prepared launch (``Fp8Path.SKINNY_TOKEN``): those of TUNED_PREPARED but
# where the quantization's launch cost more than the prepared launch saved. Measured as
# quant_per_token plus the prepared best against fp8_linear's own path before, side by side
# (``bench_paths.py --prepared --splits --tokens 4,16``, fourteenth session): 0.6-5.6 us
# faster on the other shapes. Left out, at 4 tokens: 397B's shared gate/up (Qwen3-Next's fc
# and o), 0.2 us slower, and Qwen3-Next's shared down, 0.2 us faster, within the spread.
SELF_PREPARED: frozenset[tuple[int, int, int]] = frozenset(TUNED_PREPARED) - {(4, 2048, 4096), (4, 2048, 512)}


def token_bucket(m: int) -> int | None:
    """The sweep's token count that stands for ``m`` rows (None beyond 16)."""
    if m == 1:
        return 1
    if m <= 4:
        return 4
    return 16 if m <= 16 else None
