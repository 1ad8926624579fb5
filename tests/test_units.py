"""Human-readable sizes: the one formatter the console and the model card share."""

from __future__ import annotations

import pytest

from mtpconv.units import human_bytes


@pytest.mark.parametrize(
    ("n", "text"), [(0, "0 B"), (1023, "1023 B"), (1536, "1.50 KiB"), (3 << 30, "3.00 GiB")]
)
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


def test_large_and_negative_sizes() -> None:
    assert human_bytes(5 << 40) == "5.00 TiB" and human_bytes(-2048) == "-2.00 KiB"
