"""The progress bars of `mtpconv.console`: silent when quiet or off a terminal, drawn on one."""

from __future__ import annotations

import io
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from rich.console import Console

import mtpconv.console as console
from mtpconv.progress import ProgressCallback

Bar = Callable[[], AbstractContextManager[ProgressCallback]]


@pytest.mark.parametrize("bar", [console.byte_progress, lambda: console.count_progress("tokens")])
def test_a_bar_is_drawn_on_a_terminal_and_silent_when_quiet(
    bar: Bar, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(console, "err_console", Console(file=screen, force_terminal=True, width=100))
    monkeypatch.setattr(console, "_state", {"quiet": False})
    with bar() as progress:
        progress.start("reading", 10)
        progress.advance(10)
    assert "reading" in screen.getvalue()

    screen.seek(0)
    screen.truncate()
    console.set_quiet(True)
    with bar() as progress:
        progress.start("reading", 10)
        progress.advance(10)
    assert screen.getvalue() == ""
