"""Release numbers read from version strings (Triton's and CUDA's for PDL, vLLM's for eval)."""

from __future__ import annotations

from mtpconv.versions import release


def test_versions_read() -> None:
    assert release("3.6.0+git1234") == (3, 6)
    assert release("13.0") == (13, 0)
    assert release("0.32.0+cpu") == (0, 32)
    assert release(None) is None
    assert release("dev") is None
