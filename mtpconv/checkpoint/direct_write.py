"""Writing a large new file past the page cache (``O_DIRECT``), where the filesystem allows.

A drafter shard is gigabytes written once, then fsynced. Through the page cache every
byte is first copied into cache pages the kernel has to find and clear, and the
fsync then writes them out; on the 2-core test machine a buffered 1.06 GB write +
fsync took 0.95-5.1 s wall (0.4-4.5 s of it system time, depending on how cheap fresh
pages were at the moment), against 1.5-1.8 s (0.15-0.25 s) with ``O_DIRECT``
(``python scripts/bench_write.py``, docs/BENCHMARKS.md). So a shard is written through one
page-aligned staging buffer with ``O_DIRECT``, in whole multiples of the buffer; the
last partial buffer is written the usual way.

Where the filesystem refuses ``O_DIRECT`` (tmpfs on older kernels, some network and
FUSE filesystems, platforms without it) or refuses a write for its alignment, the file
is written the usual way from then on. The bytes on disk are the same either way.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
from pathlib import Path
from typing import BinaryIO

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_STAGE = 16 << 20  # staging buffer: a multiple of every block size O_DIRECT asks for


def _set_direct(fd: int, on: bool) -> bool:
    """Turn ``O_DIRECT`` on or off for ``fd``; False where it cannot be turned on."""
    if not _O_DIRECT:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT if on else flags & ~_O_DIRECT)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False
    return on


class DirectFile:
    """A new file written front to back, past the page cache where possible.

    ``open(path, "xb")`` semantics: the file must not exist (an existing one could be a
    hard link to a source file). :meth:`close` writes what is staged and fsyncs.
    """

    def __init__(self, path: Path) -> None:
        self._f: BinaryIO = open(path, "xb", buffering=0)  # noqa: SIM115 - closed in close()/abort()
        self._direct = False
        self._stage: mmap.mmap | None = None
        self._fill = 0
        try:
            self._direct = _set_direct(self._f.fileno(), True)
        except OSError:
            self._f.close()
            raise
        if self._direct:
            self._stage = mmap.mmap(-1, _STAGE)  # anonymous maps are page-aligned

    @property
    def direct(self) -> bool:
        """Whether writes still bypass the page cache."""
        return self._direct

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data``."""
        view = memoryview(data).cast("B")
        if self._stage is None:
            self._write_all(view)
            return
        with memoryview(self._stage) as stage:
            pos = 0
            while pos < len(view):
                n = min(_STAGE - self._fill, len(view) - pos)
                stage[self._fill : self._fill + n] = view[pos : pos + n]
                self._fill += n
                pos += n
                if self._fill == _STAGE:
                    self._flush(stage)

    def _flush(self, stage: memoryview) -> None:
        """Write the staged bytes; an ``O_DIRECT`` write refused for its alignment is
        written the usual way (and so is everything after it)."""
        try:
            self._write_all(stage[: self._fill])
        except OSError as exc:
            if exc.errno != errno.EINVAL or not self._direct:
                raise
            self._direct = _set_direct(self._f.fileno(), False)
            self._write_all(stage[: self._fill])
        self._fill = 0

    def _write_all(self, view: memoryview) -> None:
        while view:
            n = self._f.write(view)
            if n is None:  # a raw file in non-blocking mode; never the case here
                raise OSError(errno.EAGAIN, "write would block")
            view = view[n:]

    def close(self) -> None:
        """Write what is staged (the usual way: it is not a whole buffer), fsync, close."""
        try:
            if self._stage is not None and self._fill:
                self._direct = _set_direct(self._f.fileno(), False)
                with memoryview(self._stage) as stage:
                    self._flush(stage)
            os.fsync(self._f.fileno())
        finally:
            self.abort()

    def abort(self) -> None:
        """Close without writing what is staged (the file is removed by its caller)."""
        self._f.close()
        if self._stage is not None:
            # A view of it may live on in a traceback: the map then goes with that view.
            with contextlib.suppress(BufferError):
                self._stage.close()
            self._stage = None
