"""The tuning tables (mtpconv/kernels/tuned/*.json) load and are well formed (CPU: no Triton needed)."""

from __future__ import annotations

import pytest

from mtpconv.kernels import tuning
from mtpconv.kernels.tuning import token_bucket

TABLE = tuning.load("NVIDIA H200")
TUNED, TUNED_PREPARED = TABLE.skinny, TABLE.prepared


def test_token_buckets() -> None:
    assert [token_bucket(m) for m in (1, 2, 4, 5, 16, 17)] == [1, 4, 4, 16, 16, None]


def test_every_tuned_entry_is_a_launchable_configuration() -> None:
    assert TUNED
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
        split,
        first,
    ) in TUNED.items():
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
        assert split in (0, 1) and (first == 0 or (tokens == 1 and narrow))


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
        split,
        _,
    ) in TUNED_PREPARED.items():
        assert tokens in (4, 16) and (tokens, n, k) in TUNED
        assert dot and mma == 3 and not narrow and split == 1, "each tile's K range in one program"
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
    wave of programs or the rows are long, eight otherwise (docs/BENCHMARKS.md, *Tuning tables*)."""
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


def test_prepared_launches_keep_k_whole_and_tabled_entries_keep_their_fields() -> None:
    """Prepared FP8 rows: every launch (tabled or by rule) runs each tile's K range in one
    program; a BF16-row entry's ``split`` and ``first_ahead`` reach its launch (27B's down at one
    token in one piece, 27B's o with its first tile ahead, the others neither)."""
    pytest.importorskip("triton")
    from mtpconv.kernels import triton_skinny as ts

    sms = 132
    for tokens, n, k in TUNED_PREPARED:
        assert ts.prepared_config(tokens, n, k, sms).split == 1
    assert ts.prepared_config(4, 777, 333, sms).split == 1  # the rule
    for (tokens, n, k), entry in TUNED.items():
        cfg = ts.default_config(tokens, n, k, sms)
        assert (cfg.split, cfg.first_ahead, cfg.programs) == (
            entry.split,
            entry.first_ahead,
            entry.waves * sms,
        )
    assert TUNED[(1, 5120, 17408)].split == 1 and TUNED[(1, 5120, 6144)].first_ahead == 1
    assert sum(e.split for e in TUNED.values()) == 1 and sum(e.first_ahead for e in TUNED.values()) == 1


def test_every_device_without_a_table_takes_the_h200s() -> None:
    assert tuning.load("NVIDIA H100 80GB HBM3") == TABLE == tuning.for_device()
    assert TABLE.device == "NVIDIA H200" and tuning.file_name(TABLE.device) == "NVIDIA_H200.json"
    assert TABLE.skinny_token <= set(TUNED_PREPARED) and TABLE.scaled_mm_fused <= TABLE.skinny_token
    with pytest.raises(ValueError, match="not a tuning table"):
        tuning.parse('{"device": "x"}')


def test_the_tuning_tables_ship_in_the_wheel() -> None:
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "kernels/tuned/*.json" in data["mtpconv"]
    assert (root / "mtpconv" / "kernels" / "tuned" / "NVIDIA_H200.json").is_file()
