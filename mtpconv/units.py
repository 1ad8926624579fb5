"""Human-readable sizes, shared by the console output and the model card (no rich here)."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``1.50 MiB``-style size: exact bytes below 1 KiB, binary units up to TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
