"""sha256 digests of checkpoint files, and the ones huggingface_hub already knows.

Hashing a 200 GB checkpoint takes minutes; a digest that huggingface_hub has
already recorded (cache blobs are named by it, ``hf download --local-dir`` keeps it
in its metadata) costs nothing. Everything here is read-only.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

_HASH_CHUNK = 8 << 20
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def sha256_file(path: str | os.PathLike[str], stop: threading.Event | None = None) -> str:
    """Hex sha256 of a file, read in 8 MiB chunks (``stop`` set: :class:`HashCancelled`)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            if stop is not None and stop.is_set():
                raise HashCancelled(path)
            h.update(chunk)
    return h.hexdigest()


class HashCancelled(Exception):
    """A background hash was stopped before it finished (the conversion ended first)."""


class HashAhead:
    """sha256 of some files, computed in a background thread while the caller does other work.

    ``quantize-mtp`` starts one for the source shards it will rewrite, before the
    conversion begins: the shards' digests are then ready, or nearly, when the
    conversion finishes them, instead of being computed inside its read stage. Both
    hashing and reading go through the page cache, so the shard comes from the disk once.
    """

    def __init__(self, paths: Iterable[Path]) -> None:
        self._paths = list(paths)
        self._done: dict[Path, str | BaseException] = {}
        self._ready = threading.Condition()
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, name="mtpconv-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for path in self._paths:
                try:
                    result: str | BaseException = sha256_file(path, self._stop)
                except HashCancelled:
                    return
                except OSError as exc:  # reported to whoever asks for this file's digest
                    result = exc
                with self._ready:
                    self._done[path] = result
                    self._ready.notify_all()
        finally:
            with self._ready:
                self._finished = True
                self._ready.notify_all()

    def __contains__(self, path: Path) -> bool:
        return path in self._paths

    def digest(self, path: Path) -> str:
        """The sha256 of ``path`` (one of the files given), waiting for it when not yet done."""
        if path not in self._paths:
            raise KeyError(path)
        with self._ready:
            self._ready.wait_for(lambda: path in self._done or self._finished)
            result = self._done.get(path, HashCancelled(path))
        if isinstance(result, BaseException):
            raise result
        return result

    def cancel(self) -> None:
        """Stop hashing (between two chunks) and wait for the thread; idempotent."""
        self._stop.set()
        self._thread.join()


def known_lfs_digest(path: Path, root: Path) -> str | None:
    """The sha256 huggingface_hub already recorded for a downloaded LFS file, if trustworthy.

    Cache snapshots link to blobs named by their sha256; ``hf download --local-dir``
    keeps ``.cache/huggingface/download/<file>.metadata`` (commit, etag, timestamp),
    whose etag is the sha256 while the file is not newer than the record. Unlike
    huggingface_hub's own reader, this never deletes a malformed record.
    """
    real = Path(os.path.realpath(path))
    if _SHA256_HEX.match(real.name) and real.parent.name == "blobs":
        return real.name
    meta = root / ".cache" / "huggingface" / "download" / f"{path.relative_to(root)}.metadata"
    try:
        _, etag, stamp = meta.read_text(encoding="utf-8").splitlines()[:3]
        fresh = real.stat().st_mtime - 1 <= float(stamp)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    etag = etag.strip().strip('"')
    return etag if fresh and _SHA256_HEX.match(etag) else None
