"""The closed choices of a conversion, shared by the CLI (as its Enum options) and the library.

Kept free of torch and of every command module, so the CLI can list them in its help
without importing the work behind them.
"""

from __future__ import annotations

from enum import Enum


class Device(str, Enum):
    """Where the FP8 math of quantize-mtp runs (``--device``); ``auto`` picks CUDA when present."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"

    def __str__(self) -> str:
        return self.value


class HeadDtype(str, Enum):
    """The storage dtype of the truncated draft head (``--draft-head-dtype``)."""

    FP8 = "fp8"
    BF16 = "bf16"

    def __str__(self) -> str:
        return self.value
