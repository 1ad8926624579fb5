"""Reading tensors of a validated checkpoint, one open shard at a time.

Like mergekit's lazy loader: a reader holds a single shard open (read-only) and
moves to another only when asked for a tensor stored there. The plan visits
the source shard by shard, so each file is opened once (an NVFP4 scale stored
in another shard than its weight costs a reopen, not a second open handle).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
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
    pass in :meth:`finish`. With ``known_digest`` nothing is hashed.
    """

    def __init__(self, path: Path, known_digest: str | None = None) -> None:
        self.path = path
        self._f: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed in finish()/close()
        self._known = known_digest
        self._sha = None if known_digest else hashlib.sha256()
        self._pos = 0

    def _seek(self, start: int) -> None:
        if self._sha is not None and start >= self._pos:
            while self._pos < start:  # a gap (header, a dropped tensor): hash it, keep nothing
                chunk = self._f.read(min(start - self._pos, _STREAM_CHUNK))
                if not chunk:
                    break
                self._sha.update(chunk)
                self._pos += len(chunk)
        else:
            self._sha = None  # out of order: finish() hashes the file in a second pass
            self._f.seek(start)

    def read(self, info: TensorInfo) -> bytearray:
        """The raw bytes of ``info`` (a tensor of this shard)."""
        self._seek(info.start)
        buf = read_tensor_bytes(self._f, info)
        self._consumed(buf, info.end)
        return buf

    def chunks(self, info: TensorInfo) -> Iterator[bytes]:
        """The raw bytes of ``info`` in chunks of at most 64 MiB (a verbatim copy)."""
        self._seek(info.start)
        left = info.nbytes
        while left:
            chunk = self._f.read(min(left, _STREAM_CHUNK))
            if not chunk:
                raise CheckpointFormatError(
                    f"{info.file}: tensor {info.name!r} is cut short; the file is truncated."
                )
            self._consumed(chunk, self._f.tell())
            left -= len(chunk)
            yield chunk

    def _consumed(self, data: bytes | bytearray, end: int) -> None:
        if self._sha is not None:
            self._sha.update(data)
            self._pos = end

    def finish(self) -> str:
        """The sha256 of the whole shard (the rest of the file is read to end it)."""
        try:
            if self._known is not None:
                return self._known
            if self._sha is None:
                return sha256_file(self.path)
            while chunk := self._f.read(_STREAM_CHUNK):
                self._sha.update(chunk)
            return self._sha.hexdigest()
        finally:
            self.close()

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._f.close()
