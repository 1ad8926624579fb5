"""The measured skinny-GEMM configurations are well formed (CPU: no Triton needed)."""

from __future__ import annotations

import pytest

from mtpconv.kernels.skinny_tuned import TUNED, TUNED_PREPARED, token_bucket


def test_token_buckets() -> None:
    assert [token_bucket(m) for m in (1, 2, 4, 5, 16, 17)] == [1, 4, 4, 16, 16, None]


def test_every_tuned_entry_is_a_launchable_configuration() -> None:
    assert TUNED
    for (tokens, n, k), (dot, block_n, block_k, warps, stages, waves, mma, tma, narrow) in TUNED.items():
        assert tokens in (1, 4, 16) and n > 0 and k > 0
        assert dot == (tokens > 1) or narrow, "FMA at one token (and the narrow GEMV to 4); the MMA above"
        assert tokens <= 4 or not narrow, "the narrow GEMV takes 1-4 tokens"
        assert mma == (2 if dot else 0), "FP8 MMA (any activation range) or FMA"
        for v in (block_n, block_k, warps):
            assert v & (v - 1) == 0, "Triton tiles and warps are powers of two"
        assert block_k >= 128 or not dot  # the FP8 MMA's K tile
        assert 2 <= stages <= 4 and 1 <= waves <= 16
        assert not (narrow and dot), "narrow weight loads are the FMA path's"
        if tma:  # a TMA box is at most 256 elements a side; K rows 16-byte aligned
            assert block_k <= 256 and block_n <= 256 and k % 16 == 0


def test_every_prepared_entry_is_an_fp8_mma_on_a_measured_shape() -> None:
    """FP8 rows prepared before the launch: the MMA reading them as they are (mma 3), at 2-16
    tokens, on shapes the weight-only table has too (the benchmarked drafters')."""
    assert TUNED_PREPARED
    for (tokens, n, k), (
        dot,
        block_n,
        block_k,
        warps,
        stages,
        waves,
        mma,
        tma,
        narrow,
    ) in TUNED_PREPARED.items():
        assert tokens in (4, 16) and (tokens, n, k) in TUNED
        assert dot and mma == 3 and not narrow
        for v in (block_n, block_k, warps):
            assert v & (v - 1) == 0
        assert block_n >= 32 and block_k >= 128 and 2 <= stages <= 8 and 1 <= waves <= 16
        # the resident programs' pipelines (FP8 weight and activation tiles, the activation
        # padded to the MMA's 16 rows) fit the H200's 227 KiB of shared memory an SM
        assert waves * stages * (block_n + 16) * block_k <= 227 * 1024
        if tma:
            assert block_k <= 256 and block_n <= 256 and k % 16 == 0


def test_rule_for_untabled_one_token_shapes() -> None:
    """From K = 4096 the narrow GEMV: two rows a program where 8-row tiles would not fill a
    wave of programs or the rows are long, eight otherwise (scripts/bench_rule.py)."""
    ts = pytest.importorskip("mtpconv.kernels.triton_skinny")
    sms = 132
    cases = {(3072, 5120): 2, (576, 7168): 2, (7168, 14336): 2, (4096, 4096): 2, (6144, 4096): 8}
    cases |= {(5120, 12288): 8, (22016, 4096): 8}
    for (n, k), rows in cases.items():
        assert (1, n, k) not in TUNED
        cfg = ts.default_config(1, n, k, sms)
        assert cfg.narrow and not cfg.dot and cfg.block_n == rows, (n, k, cfg)
    assert not ts.default_config(1, 24576, 1536, sms).narrow  # below K = 4096: the plain FMA path
    # the table still wins over the rule
    (t, n, k), entry = next((key, v) for key, v in TUNED.items() if key[0] == 1)
    assert ts.default_config(t, n, k, sms).block_n == entry[1]


def test_prepared_launches_and_one_piece_entries_keep_k_whole() -> None:
    """Prepared FP8 rows: every launch (tabled or by rule) runs each tile's K range in one
    program; one-token entries do so only where ``ONE_PIECE`` names them."""
    pytest.importorskip("triton")
    from mtpconv.kernels import triton_skinny as ts
    from mtpconv.kernels.skinny_tuned import ONE_PIECE

    sms = 132
    for tokens, n, k in TUNED_PREPARED:
        assert ts.prepared_config(tokens, n, k, sms).split == 1
    assert ts.prepared_config(4, 777, 333, sms).split == 1  # the rule
    assert all(key in TUNED for key in ONE_PIECE)
    for key in TUNED:
        assert ts.default_config(key[0], key[1], key[2], sms).split == (1 if key in ONE_PIECE else 0)
