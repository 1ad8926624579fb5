"""paused_gc: the collector is off inside and restored as it was, errors included."""

from __future__ import annotations

import gc

import pytest

from mtpconv.gc_pause import paused_gc


def test_paused_then_restored() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():  # nested: still off, and the outer one restores
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_restored_after_an_error_and_left_off_when_it_was_off() -> None:
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_freeze_on_resume_moves_what_was_built_out_of_the_collectors_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mtpconv import gc_pause

    monkeypatch.setitem(gc_pause._state, "freeze", False)
    gc_pause.freeze_on_resume()
    try:
        with paused_gc():
            kept = [{"i": i} for i in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()
