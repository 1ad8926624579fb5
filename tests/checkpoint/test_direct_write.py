"""Shards written past the page cache hold exactly the bytes given, whichever way the
filesystem lets them be written."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mtpconv.checkpoint.direct_write as direct_write
from mtpconv.checkpoint.direct_write import DirectFile

_STAGE = 64 << 10  # a small staging buffer, so a test crosses many of them


@pytest.fixture(autouse=True)
def small_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct_write, "_STAGE", _STAGE)


def _pieces(seed: int, total: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out, left = [], total
    while left:
        n = min(left, int(rng.integers(1, 3 * _STAGE)))
        out.append(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        left -= n
    return out


def _write(path: Path, pieces: list[bytes]) -> DirectFile:
    f = DirectFile(path)
    for p in pieces:
        f.write(memoryview(np.frombuffer(p, dtype=np.uint8)))
    f.close()
    return f


@pytest.mark.parametrize("total", [0, 1, _STAGE, 5 * _STAGE + 4097])
def test_the_file_holds_exactly_the_bytes_written(tmp_path: Path, total: int) -> None:
    pieces = _pieces(total, total)
    _write(tmp_path / "f", pieces)
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)


def test_without_o_direct_the_bytes_are_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct_write, "_O_DIRECT", 0)
    pieces = _pieces(1, 3 * _STAGE + 5)
    f = _write(tmp_path / "f", pieces)
    assert not f.direct
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)


class _RefusesOnce:
    """A raw file whose first write fails as an O_DIRECT write of the wrong alignment does."""

    def __init__(self, f: Any) -> None:
        self._f, self.refused = f, False

    def write(self, data: Any) -> int:
        if not self.refused:
            self.refused = True
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return int(self._f.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def test_a_refused_direct_write_falls_back_to_the_page_cache(tmp_path: Path) -> None:
    f = DirectFile(tmp_path / "f")
    if not f.direct:
        f.abort()
        pytest.skip("this filesystem takes no O_DIRECT writes")
    wrapped = _RefusesOnce(f._f)
    f._f = wrapped  # type: ignore[assignment]
    pieces = _pieces(2, 4 * _STAGE + 3)
    for p in pieces:
        f.write(p)
    f.close()
    assert wrapped.refused and not f.direct
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)


def test_an_existing_file_is_never_written(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"source")
    with pytest.raises(FileExistsError):
        DirectFile(tmp_path / "f")
    assert (tmp_path / "f").read_bytes() == b"source"
