"""Writing a checkpoint: streamed safetensors shards, its index, links, and an atomic output dir.

Nothing appears at the destination until the whole variant is written and
fsynced: we build it in a sibling temporary directory and rename it into place.
A lock file next to the destination keeps two conversions from racing, and
temporary directories left by a killed run are removed by the next one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from mtpconv.checkpoint.direct_write import DirectFile
from mtpconv.checkpoint.index import INDEX_NAME, index_text
from mtpconv.checkpoint.safetensors_io import DTYPE_SIZES, torch_dtype
from mtpconv.errors import OutputError, Param
from mtpconv.jsonio import write_text_durably

if TYPE_CHECKING:
    import torch

_TMP_MARK = ".mtpconv-tmp-"
_COPY_CHUNK = 64 << 20


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to be written: name, safetensors dtype and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw little-endian bytes of a tensor (moved to the CPU), without a copy when contiguous."""
    import torch

    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]


def _disk_error(exc: OSError, path: Path) -> OutputError:
    if exc.errno == errno.ENOSPC:
        return OutputError(
            f"no space left on the device while writing {path}; free space "
            "and run again (nothing was left at the destination)."
        )
    return OutputError(f"cannot write {path}: {exc.strerror or exc}.")


class HashingWriter:
    """A binary file being written, hashed as it goes (sha256), past the page cache where
    the filesystem allows (:mod:`mtpconv.checkpoint.direct_write`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # A new file, always: never truncate an existing one, which could be a hard link
        # to a source file (the source must never be written through the output).
        try:
            self._f = DirectFile(path)
        except OSError as exc:
            raise _disk_error(exc, path) from None
        self._sha = hashlib.sha256()
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self._f.write(data)
        except OSError as exc:
            raise _disk_error(exc, self.path) from None
        self._sha.update(data)
        self.written += len(data)

    def copy_range(self, src: BinaryIO, start: int, nbytes: int) -> None:
        """Copy ``nbytes`` from ``src`` at ``start`` verbatim."""
        src.seek(start)
        left = nbytes
        while left:
            chunk = src.read(min(left, _COPY_CHUNK))
            if not chunk:
                raise OutputError(f"source file {getattr(src, 'name', '?')} ended early.")
            self.write(chunk)
            left -= len(chunk)

    def close(self) -> str:
        """Write out, fsync, close, and return the hex sha256."""
        try:
            self._f.close()
        except OSError as exc:
            raise _disk_error(exc, self.path) from None
        return self._sha.hexdigest()

    def abort(self) -> None:
        self._f.abort()


def safetensors_header(specs: list[TensorSpec], metadata: dict[str, str] | None) -> bytes:
    """The 8-byte length + JSON header for tensors laid out in ``specs`` order."""
    doc: dict[str, object] = {}
    if metadata:
        doc["__metadata__"] = dict(metadata)
    offset = 0
    for spec in specs:
        doc[spec.name] = {
            "dtype": spec.dtype,
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    raw = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # data region 8-byte aligned, as safetensors does
    return len(raw).to_bytes(8, "little") + raw


class ShardWriter:
    """Streams one safetensors file: header first, then each tensor in order."""

    def __init__(self, path: Path, specs: list[TensorSpec], metadata: dict[str, str] | None):
        self.path = path
        self._specs = specs
        self._next = 0
        self._left = 0  # bytes still due for a tensor written in parts
        self._out = HashingWriter(path)
        self._out.write(safetensors_header(specs, metadata))

    def _expect(self, name: str, nbytes: int) -> None:
        spec = self._specs[self._next]
        if spec.name != name or spec.nbytes != nbytes:
            raise AssertionError(f"writer expected {spec.name} ({spec.nbytes} B), got {name}")
        self._next += 1

    def write(self, name: str, data: bytes | bytearray | memoryview) -> None:
        """Write the next tensor's raw bytes (it must be the next one planned)."""
        self.begin(name, len(data))
        self.write_part(data)

    def begin(self, name: str, nbytes: int) -> None:
        """Start the next tensor, whose ``nbytes`` follow through :meth:`write_part`."""
        if self._left:
            raise AssertionError(f"{self.path.name}: {self._left} bytes of the previous tensor unwritten")
        self._expect(name, nbytes)
        self._left = nbytes

    def write_part(self, data: bytes | bytearray | memoryview) -> None:
        """The next bytes of the tensor begun last."""
        if len(data) > self._left:
            raise AssertionError(f"{self.path.name}: {len(data) - self._left} bytes more than planned")
        self._out.write(data)
        self._left -= len(data)

    def write_tensor(self, name: str, t: torch.Tensor) -> None:
        """Write the next tensor from a torch tensor of the planned dtype."""
        spec = self._specs[self._next] if self._next < len(self._specs) else None
        if spec is not None and spec.name == name and torch_dtype(spec.dtype) != t.dtype:
            raise AssertionError(f"writer expected {name} as {spec.dtype}, got {t.dtype}")
        self.write(name, tensor_bytes(t))

    def copy(self, name: str, src: BinaryIO, start: int, nbytes: int) -> None:
        """Copy the next tensor verbatim from ``src`` at ``start``."""
        self._expect(name, nbytes)
        self._out.copy_range(src, start, nbytes)

    def close(self) -> str:
        """Check every planned tensor was written, fsync, and return the file's sha256."""
        if self._next != len(self._specs) or self._left:
            self._out.abort()
            raise AssertionError(f"{self.path.name}: {len(self._specs) - self._next} tensors unwritten")
        return self._out.close()

    def abort(self) -> None:
        self._out.abort()


@dataclass
class IndexWriter:
    """The weight map of a checkpoint being written; it writes the index at the end.

    Each shard reports its tensors (name and byte size) as it is written or
    linked; :meth:`write` turns them into ``model.safetensors.index.json``.
    """

    metadata: Mapping[str, Any]
    weight_map: dict[str, str] = field(default_factory=dict)
    total_size: int = 0

    def add(self, file: str, tensors: Iterable[tuple[str, int]]) -> None:
        """Record that ``file`` holds ``tensors`` (name, nbytes)."""
        for name, nbytes in tensors:
            self.weight_map[name] = file
            self.total_size += nbytes

    def write(self, directory: Path) -> str:
        """Write the index into ``directory`` durably and return its sha256."""
        text = index_text(self.metadata, self.weight_map, self.total_size)
        return write_json(directory / INDEX_NAME, text)


def link_or_copy(src: Path, dst: Path, *, copy: bool = False) -> bool:
    """Hard-link ``src`` to ``dst`` (following links); copy when linking is impossible.

    Returns True when the file was linked.
    """
    real = Path(os.path.realpath(src))
    if not copy:
        try:
            os.link(real, dst)
            return True
        except OSError:
            pass
    try:
        shutil.copyfile(real, dst)
        with open(dst, "rb+") as f:
            os.fsync(f.fileno())
    except OSError as exc:
        raise _disk_error(exc, dst) from None
    return False


def write_json(path: Path, text: str) -> str:
    """Write a small text file durably and return its sha256 (a disk fault names the file)."""
    try:
        return write_text_durably(path, text)
    except OSError as exc:
        raise _disk_error(exc, path) from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    """Remove a directory tree, or a file / link (a --force'd destination may be a file)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _remove_stale_temps(dst: Path) -> list[Path]:
    removed = []
    for entry in dst.parent.glob(f".{dst.name}{_TMP_MARK}*"):
        try:
            pid = int(entry.name.rsplit(_TMP_MARK, 1)[1].split("-", 1)[0])
        except ValueError:
            continue
        # Called under the lock, so a temp with our own pid is stale too: a killed run in
        # a container often had the same pid (1, 7, ...) as the run that finds its leftovers.
        if pid == os.getpid() or not _pid_alive(pid):
            _remove(entry)
            removed.append(entry)
    return removed


@contextlib.contextmanager
def _lock(dst: Path) -> Iterator[None]:
    lock_path = dst.parent / f".{dst.name}.mtpconv.lock"
    while True:
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Only the holder removes the lock file: a loser unlinking it would let a
            # third process lock a fresh file and write alongside the holder.
            os.close(fd)
            raise OutputError(f"another mtpconv process is writing {dst}; wait for it to finish.") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the previous holder removed this file after we opened it; retry
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)


@contextlib.contextmanager
def atomic_output_dir(dst: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``dst``; on success it becomes ``dst`` atomically.

    On any exception (KeyboardInterrupt included) the temporary directory is
    removed and ``dst`` is untouched.
    """
    dst = Path(os.path.abspath(dst))
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _disk_error(exc, dst.parent) from None
    with _lock(dst):
        _remove_stale_temps(dst)
        if dst.exists() and not force:
            raise OutputError(f"{dst} already exists; pass ", Param("force", True), " to replace it.")
        tmp = dst.parent / f".{dst.name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            yield tmp
            _fsync_dir(tmp)
            if force and dst.exists():
                old = dst.parent / f".{dst.name}{_TMP_MARK}{os.getpid()}-old-{uuid.uuid4().hex[:8]}"
                os.rename(dst, old)
                os.rename(tmp, dst)
                _remove(old)
            else:
                os.rename(tmp, dst)
            _fsync_dir(dst.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
