"""Release numbers of the software mtpconv runs beside (Triton, CUDA, vLLM)."""

from __future__ import annotations

import re


def release(text: str | None) -> tuple[int, int] | None:
    """``"3.6.0+git"`` -> (3, 6), ``"0.32.0+cpu"`` -> (0, 32); None for None or text that does
    not start with one."""
    found = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(found[1]), int(found[2])) if found else None
