"""Bounded, validated safetensors header parsing and lazy tensor reads.

A safetensors file is ``u64 little-endian N`` + ``N`` bytes of JSON header +
the data region. We parse the header ourselves (so ``inspect`` never touches
tensor data and every inconsistency is reported with the file and tensor
name), and read a tensor's bytes only when asked.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, NamedTuple

from mtpconv.errors import CheckpointFormatError
from mtpconv.jsonio import no_duplicate_keys

if TYPE_CHECKING:
    import torch

# Largest header we accept: real headers of 200 GB checkpoints are a few MiB.
MAX_HEADER_BYTES = 100 * 1024 * 1024

# safetensors' dtype strings (a header's "dtype"), each spelled here once.
F64, F32, F16, BF16 = "F64", "F32", "F16", "BF16"
I64, I32, I16, I8 = "I64", "I32", "I16", "I8"
U64, U32, U16, U8 = "U64", "U32", "U16", "U8"
BOOL, F8_E4M3, F8_E5M2 = "BOOL", "F8_E4M3", "F8_E5M2"

# safetensors dtype string -> bytes per element. Header work (inspect, --dry-run,
# fix-exclusions, verify) needs only sizes; torch is imported when a tensor is read.
DTYPE_SIZES: dict[str, int] = {
    F64: 8,
    F32: 4,
    F16: 2,
    BF16: 2,
    I64: 8,
    I32: 4,
    I16: 2,
    I8: 1,
    U8: 1,
    U16: 2,
    U32: 4,
    U64: 8,
    BOOL: 1,
    F8_E4M3: 1,
    F8_E5M2: 1,
}
FLOAT_DTYPES = frozenset({F64, F32, F16, BF16})
FP8_DTYPES = frozenset({F8_E4M3, F8_E5M2})


class TensorInfo(NamedTuple):
    """One tensor as described by a header: where its bytes lie in ``file``.

    A named tuple, not a dataclass: a large checkpoint has ~400k of them, built in a
    few times less time this way.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str  # shard file name, relative to the checkpoint directory
    start: int  # absolute byte offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header of one file."""

    file: str
    data_start: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] | None


def parse_header_bytes(raw: bytes, *, file: str, data_size: int, data_start: int) -> SafetensorsHeader:
    """Validate a decoded header against the size of the data region that follows it."""
    where = f"{file}: safetensors header"
    try:
        doc = json.loads(
            raw.decode("utf-8"), object_pairs_hook=no_duplicate_keys(where, CheckpointFormatError)
        )
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointFormatError(
            f"{where} is not valid JSON ({exc}); the file is corrupt or not safetensors."
        ) from None
    if not isinstance(doc, dict):
        raise CheckpointFormatError(f"{where} is not a JSON object; the file is corrupt.")
    metadata = doc.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise CheckpointFormatError(f"{where} has a __metadata__ that is not a string map.")
    tensors: dict[str, TensorInfo] = {}
    sizes, prod = DTYPE_SIZES, math.prod
    for name, entry in doc.items():
        # The common, valid entry is checked inline (a 397B checkpoint has ~400k of them);
        # anything unusual goes to _parse_entry, which names exactly what is wrong.
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            valid = (
                type(shape) is list
                and type(begin) is int
                and type(end) is int
                and all(type(d) is int and d >= 0 for d in shape)
                and 0 <= begin <= end <= data_size
                and end - begin == prod(shape) * sizes[dtype]
            )
        except (TypeError, KeyError, ValueError):
            valid = False
        if valid:
            tensors[name] = TensorInfo(name, dtype, tuple(shape), file, data_start + begin, data_start + end)
        else:
            tensors[name] = _parse_entry(name, entry, file=file, data_size=data_size, data_start=data_start)
    _check_overlaps(tensors, file)
    return SafetensorsHeader(file=file, data_start=data_start, tensors=tensors, metadata=metadata)


def _parse_entry(name: str, entry: Any, *, file: str, data_size: int, data_start: int) -> TensorInfo:
    where = f"{file}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise CheckpointFormatError(f"{where} has a header entry that is not an object.")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise CheckpointFormatError(f"{where} has unsupported dtype {dtype!r}.")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise CheckpointFormatError(f"{where} has an invalid shape {shape!r}.")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise CheckpointFormatError(f"{where} has invalid data_offsets {offsets!r}.")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise CheckpointFormatError(
            f"{where} has data_offsets {offsets} outside the data region of {data_size} bytes; "
            "the file is truncated or corrupt."
        )
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != expected:
        raise CheckpointFormatError(
            f"{where} spans {end - begin} bytes but {dtype} x {shape} needs {expected}; "
            "the header is corrupt."
        )
    return TensorInfo(
        name=name, dtype=dtype, shape=tuple(shape), file=file, start=data_start + begin, end=data_start + end
    )


def _check_overlaps(tensors: dict[str, TensorInfo], file: str) -> None:
    spans = sorted((t.start, t.end, t.name) for t in tensors.values() if t.end > t.start)
    for (_, prev_end, prev), (start, _, name) in zip(spans, spans[1:], strict=False):
        if start < prev_end:
            raise CheckpointFormatError(
                f"{file}: tensors {prev!r} and {name!r} overlap in the data region; the file is corrupt."
            )


def read_header(path: str | os.PathLike[str], *, file: str | None = None) -> SafetensorsHeader:
    """Read and validate the header of one safetensors file, reading no tensor data."""
    path = Path(path)
    label = file or path.name
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise CheckpointFormatError(f"{label} is {size} bytes, too short for a safetensors file.")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise CheckpointFormatError(
                    f"{label} declares a {n}-byte header but the file has {size} bytes; "
                    "the file is truncated or not safetensors."
                )
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointFormatError(f"cannot read {path}: {exc.strerror or exc}.") from None
    return parse_header_bytes(raw, file=label, data_size=size - 8 - n, data_start=8 + n)


def read_tensor_bytes(f: IO[bytes], info: TensorInfo) -> bytearray:
    """The raw bytes of one tensor from an open file."""
    f.seek(info.start)
    buf = bytearray(info.nbytes)
    view = memoryview(buf)
    got = 0
    while got < info.nbytes:
        n = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            raise CheckpointFormatError(
                f"{info.file}: tensor {info.name!r} is cut short at byte {info.start + got}; "
                "the file is truncated."
            )
        got += n
    return buf


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype string (imports torch)."""
    import torch

    table: dict[str, torch.dtype] = {
        F64: torch.float64,
        F32: torch.float32,
        F16: torch.float16,
        BF16: torch.bfloat16,
        I64: torch.int64,
        I32: torch.int32,
        I16: torch.int16,
        I8: torch.int8,
        U8: torch.uint8,
        U16: torch.uint16,
        U32: torch.uint32,
        U64: torch.uint64,
        BOOL: torch.bool,
        F8_E4M3: torch.float8_e4m3fn,
        F8_E5M2: torch.float8_e5m2,
    }
    return table[dtype]


def tensor_from_bytes(buf: bytearray | memoryview, info: TensorInfo) -> torch.Tensor:
    """A CPU torch tensor over ``buf`` (the raw bytes of ``info``), sharing its memory."""
    import torch

    dtype = torch_dtype(info.dtype)
    if info.nbytes == 0:
        return torch.empty(info.shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype).reshape(info.shape)


def read_tensor(f: BinaryIO, info: TensorInfo) -> torch.Tensor:
    """One tensor from an open file, as a CPU torch tensor (owning its memory)."""
    return tensor_from_bytes(read_tensor_bytes(f, info), info)
