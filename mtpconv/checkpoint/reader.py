"""Reading tensors of a validated checkpoint, one open shard at a time.

Like mergekit's lazy loader: a reader holds a single shard open (read-only) and
moves to another only when asked for a tensor stored there. The plan visits
the source shard by shard, so each file is opened once (an NVFP4 scale stored
in another shard than its weight costs a reopen, not a second open handle).
"""

from __future__ import annotations

from types import TracebackType
from typing import BinaryIO

import torch

from mtpconv.checkpoint.index import CheckpointFiles
from mtpconv.checkpoint.safetensors_io import TensorInfo, read_tensor, read_tensor_bytes


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
