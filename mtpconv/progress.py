"""The one progress protocol: what long-running library functions call.

Library modules accept an optional :class:`ProgressCallback` and never print;
:mod:`mtpconv.console` gives the CLI's bars this shape. Kept free of rich, so the
library can name it without importing the CLI's printing.
"""

from __future__ import annotations

from typing import Protocol


class ProgressCallback(Protocol):
    """``start(description, total)``, then ``advance(n)`` units of ``total`` (bytes, tokens)."""

    def start(self, description: str, total: int) -> None: ...

    def advance(self, n: int) -> None: ...
