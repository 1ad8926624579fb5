"""Reading tensors of a validated checkpoint, one open shard at a time.

Like mergekit's lazy loader: a reader holds a single shard open (read-only) and
moves to another only when asked for a tensor stored there. The plan visits
the source shard by shard, so each file is opened once (an NVFP4 scale stored
in another shard than its weight costs a reopen, not a second open handle).
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO

from mtpconv.checkpoint.digests import sha256_file
from mtpconv.checkpoint.index import CheckpointFiles
from mtpconv.checkpoint.safetensors_io import TensorInfo, read_tensor, read_tensor_bytes
from mtpconv.errors import CheckpointFormatError

if TYPE_CHECKING:
    import torch

_STREAM_CHUNK = 64 << 20


class ShardReader:
    """Reads tensors (raw bytes or torch) of ``files``; one shard file open at a time."""

    def __init__(self, files: CheckpointFiles) -> None:
        self._files = files
        self._open: tuple[str, BinaryIO] | None = None

    def info(self, name: str) -> TensorInfo:
        """Where tensor ``name`` lies (shard file, offsets, dtype, shape)."""
        return self._files.tensors[name]

    def handle(self, name: str) -> BinaryIO:
        """The open file holding tensor ``name`` (valid until the next call for another shard)."""
        file = self.info(name).file
        if self._open is None or self._open[0] != file:
            self.close()
            self._open = (file, open(self._files.directory / file, "rb"))  # noqa: SIM115
        return self._open[1]

    def read_bytes(self, name: str) -> bytearray:
        """The raw bytes of tensor ``name`` as stored."""
        return read_tensor_bytes(self.handle(name), self.info(name))

    def tensor(self, name: str) -> torch.Tensor:
        """Tensor ``name`` as a CPU torch tensor of its stored dtype."""
        return read_tensor(self.handle(name), self.info(name))

    def close(self) -> None:
        """Close the open shard, if any."""
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ShardStream:
    """One shard read front to back, hashing each of its bytes once as it goes.

    The rewrite of a drafter shard asks for its tensors in file order (the plan
    orders them so), so the sha256 of the source shard comes from the very reads
    the conversion makes. A read before the current position (a scale stored
    ahead of its weight) is served too; the digest is then computed by a second
    pass in :meth:`finish`. With ``known_digest`` (the digest, or a function that
    returns it when :meth:`finish` asks, e.g. a :class:`HashAhead`'s) nothing is hashed.

    The file is mapped privately (copy-on-write, never written back): a tensor is a
    view of the page cache, not a copy in fresh memory, and :meth:`release` drops the
    pages of a range its consumer is done with, so the mapping does not grow the
    process's memory with the shard. A released page read again is simply read again.
    """

    def __init__(self, path: Path, known_digest: str | Callable[[], str] | None = None) -> None:
        self.path = path
        self._f: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed in finish()/close()
        size = os.fstat(self._f.fileno()).st_size
        self._map = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
        self._view = memoryview(self._map) if self._map is not None else memoryview(b"")
        self._known = known_digest
        self._sha = None if known_digest else hashlib.sha256()
        self._pos = 0

    def _span(self, info: TensorInfo) -> memoryview:
        if info.end > len(self._view):
            raise CheckpointFormatError(
                f"{info.file}: tensor {info.name!r} is cut short at byte {len(self._view)}; "
                "the file is truncated."
            )
        return self._view[info.start : info.end]

    def _seek(self, start: int) -> None:
        if self._sha is not None and start >= self._pos:
            self._sha.update(self._view[self._pos : start])  # a gap (header, a dropped tensor)
            self._pos = start
        else:
            self._sha = None  # out of order: finish() hashes the file in a second pass

    def read(self, info: TensorInfo) -> memoryview:
        """The raw bytes of ``info`` (a tensor of this shard): a view, valid until :meth:`close`."""
        span = self._span(info)
        self._seek(info.start)
        self._consumed(span, info.end)
        return span

    def chunks(self, info: TensorInfo) -> Iterator[tuple[int, memoryview]]:
        """The raw bytes of ``info`` in views of at most 64 MiB (a verbatim copy), each
        with its offset in the file (for :meth:`release`)."""
        span = self._span(info)
        self._seek(info.start)
        for lo in range(0, info.nbytes, _STREAM_CHUNK):
            chunk = span[lo : lo + _STREAM_CHUNK]
            self._consumed(chunk, info.start + lo + len(chunk))
            yield info.start + lo, chunk

    def _consumed(self, data: memoryview, end: int) -> None:
        if self._sha is not None:
            self._sha.update(data)
            self._pos = end

    def release(self, start: int, end: int) -> None:
        """Bytes ``[start, end)`` are no longer needed: drop their whole pages from memory."""
        lo = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        hi = end // mmap.PAGESIZE * mmap.PAGESIZE
        if self._map is not None and hi > lo and not self._map.closed:
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def finish(self) -> str:
        """The sha256 of the whole shard (the rest of the file is hashed to end it)."""
        try:
            if self._known is not None:
                return self._known if isinstance(self._known, str) else self._known()
            if self._sha is None:
                return sha256_file(self.path)
            self._sha.update(self._view[self._pos :])
            return self._sha.hexdigest()
        finally:
            self.close()

    def close(self) -> None:
        """Unmap and close the file (idempotent). A view still held elsewhere keeps the
        mapping alive until it is dropped."""
        try:
            self._view.release()
            if self._map is not None:
                self._map.close()
        except BufferError:
            pass  # views handed out are still alive: the mapping goes with the last of them
        self._f.close()
