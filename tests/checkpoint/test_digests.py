"""HashAhead: digests computed in a background thread, errors and cancellation."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from mtpconv.checkpoint import digests
from mtpconv.checkpoint.digests import HashAhead, HashCancelled, sha256_file


def _files(tmp_path: Path, sizes: list[int]) -> list[Path]:
    paths = []
    for i, size in enumerate(sizes):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(bytes((i * 7 + j) % 251 for j in range(size)))
        paths.append(p)
    return paths


def test_digests_match_hashlib_in_any_order(tmp_path: Path) -> None:
    paths = _files(tmp_path, [0, 1, 3 << 20])
    ahead = HashAhead(paths)
    try:
        for p in reversed(paths):  # asking for a later file first waits for it
            assert ahead.digest(p) == hashlib.sha256(p.read_bytes()).hexdigest()
        assert paths[0] in ahead and tmp_path / "other" not in ahead
        with pytest.raises(KeyError):
            ahead.digest(tmp_path / "other")
    finally:
        ahead.cancel()


def test_a_read_error_reaches_whoever_asks(tmp_path: Path) -> None:
    good, missing = tmp_path / "good.bin", tmp_path / "missing.bin"
    good.write_bytes(b"abc")
    ahead = HashAhead([missing, good])
    try:
        with pytest.raises(FileNotFoundError):
            ahead.digest(missing)
        assert ahead.digest(good) == hashlib.sha256(b"abc").hexdigest()  # the next file is still hashed
    finally:
        ahead.cancel()


def test_cancel_stops_between_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _files(tmp_path, [4 << 10, 4 << 10])
    monkeypatch.setattr(digests, "_HASH_CHUNK", 1 << 10)
    started, release = threading.Event(), threading.Event()

    def slow_sha256_file(path: Path, stop: threading.Event | None = None) -> str:
        started.set()
        release.wait(5)
        return sha256_file(path, stop)

    monkeypatch.setattr(digests, "sha256_file", slow_sha256_file)
    ahead = HashAhead(paths)
    assert started.wait(5)
    stopper = threading.Thread(target=ahead.cancel)
    stopper.start()
    release.set()
    stopper.join(5)
    assert not stopper.is_alive()
    with pytest.raises(HashCancelled):  # a cancelled digest is never reported as done
        ahead.digest(paths[1])


def test_sha256_file_honours_stop(tmp_path: Path) -> None:
    (p,) = _files(tmp_path, [1 << 20])
    stop = threading.Event()
    stop.set()
    with pytest.raises(HashCancelled):
        sha256_file(p, stop)
    assert sha256_file(p) == hashlib.sha256(p.read_bytes()).hexdigest()
