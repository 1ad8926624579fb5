"""Pausing CPython's cyclic garbage collector while headers become objects.

A 397B-class checkpoint has ~400k tensors; reading its headers and auditing its
quant config make a few million small dicts, tuples and records that live until
the command ends. The collector re-walks every one of them each time its young
generations fill (measured: 13.5 s vs 4.7 s for `load_files` on such a header set,
`docs/BENCHMARKS.md`). None of them form reference cycles, so nothing is lost by
collecting once, afterwards.

Resuming costs one walk over everything built during the pause (it all sits in the
young generation). A command-line run, whose records live until the process exits,
calls :func:`freeze_on_resume` once: each pause then ends by moving what exists to
the collector's permanent generation (``gc.freeze``), which it never walks again;
reference counting still frees everything as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_state = {"freeze": False}


def freeze_on_resume() -> None:
    """For a short-lived process (the CLI): end every pause with ``gc.freeze()``."""
    _state["freeze"] = True


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run the block with the cyclic collector off; it is restored as it was (nested: once)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if _state["freeze"]:
                gc.freeze()
            gc.enable()
