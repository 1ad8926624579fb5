"""Everything that prints: a rich console on stderr, progress bars, JSON on stdout.

Library modules never print; they return records and accept an optional
progress callback. Only the CLI (``mtpconv/cli/``) and this module import rich.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from mtpconv.progress import ProgressCallback

# Re-exported: the renderers take every formatting helper from here.

err_console = Console(stderr=True, highlight=False, soft_wrap=True)
out_console = Console(highlight=False, soft_wrap=True)

_state = {"quiet": False}


def set_quiet(quiet: bool) -> None:
    _state["quiet"] = quiet


def is_quiet() -> bool:
    return _state["quiet"]


class _NullProgress:
    def start(self, description: str, total: int) -> None:
        pass

    def advance(self, n: int) -> None:
        pass


class _RichProgress:
    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task: Any = None

    def start(self, description: str, total: int) -> None:
        if self._task is not None:  # close the previous bar at its own total
            done = next(t for t in self._progress.tasks if t.id == self._task)
            self._progress.update(self._task, completed=done.total)
        self._task = self._progress.add_task(description, total=total)

    def advance(self, n: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, n)


@contextmanager
def _progress_bar(*columns: ProgressColumn) -> Iterator[ProgressCallback]:
    """A progress bar of ``columns`` on a terminal; silent when quiet or not a TTY."""
    if is_quiet() or not err_console.is_terminal:
        yield _NullProgress()
        return
    with Progress(*columns, console=err_console, transient=False) as progress:
        yield _RichProgress(progress)


def byte_progress() -> AbstractContextManager[ProgressCallback]:
    """A bytes progress bar on a terminal; silent when quiet or not a TTY."""
    return _progress_bar(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )


class _RateColumn(ProgressColumn):
    """Items per second of a counting bar (e.g. tokens/s while generating)."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Any) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} {self.unit}/s" if speed else f"? {self.unit}/s")


def count_progress(unit: str = "items") -> AbstractContextManager[ProgressCallback]:
    """A counting progress bar (e.g. tokens) on a terminal; silent otherwise."""
    return _progress_bar(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn(f"{{task.completed:,.0f}} {unit}"),
        _RateColumn(unit),
        TimeRemainingColumn(),
    )


def info(message: str) -> None:
    """A hint or notice on stderr (suppressed by --quiet)."""
    if not is_quiet():
        err_console.print(escape(message))


def warn(message: str) -> None:
    err_console.print(f"[yellow]Warning:[/yellow] {escape(message)}")


def error(message: str) -> None:
    err_console.print(f"[red]Error:[/red] {escape(message)}")


def emit_json(doc: Any) -> None:
    """One JSON document on stdout (data goes to stdout, everything else to stderr)."""
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stdout.flush()
