"""A 1-D int64 tensor written in ``torch.save``'s file format, without importing torch.

The draft-vocabulary ids file is a ``torch.save`` file (DESIGN §5; SGLang reads it as
``--speculative-token-map`` with ``torch.load``). Importing torch only to write a few
thousand integers cost build-draft-vocab 2-3 s of start-up on the 2-core test machine
(`python -X importtime`), more than its counting gains on a small corpus. The format
is torch's zip archive (format version 3): uncompressed records under one folder,
each record's data 64-byte aligned, a protocol-2 pickle of
``torch._utils._rebuild_tensor_v2`` over a ``LongStorage`` persistent id, and the raw
little-endian storage. ``torch.load(..., weights_only=True)`` reads it as the tensor
``torch.save`` would have written (tests/formats/test_torch_file.py checks both ways).
"""

from __future__ import annotations

import hashlib
import struct
import zipfile
from pathlib import Path

import numpy as np

_FOLDER = "ids"
_ALIGN = 64  # torch aligns every record's data to 64 bytes (".storage_alignment")
_PAD_TAG = b"FB"  # the extra-field id torch's writer pads local headers with


def _unicode(s: str) -> bytes:
    raw = s.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _int(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)  # BININT: every count here is below 2**31


def _pickle(numel: int) -> bytes:
    """The pickle torch.save writes for a contiguous 1-D int64 tensor of ``numel`` values."""
    return b"".join(
        [
            b"\x80\x02",  # PROTO 2
            b"ctorch._utils\n_rebuild_tensor_v2\n",
            b"((",  # MARK (args), MARK (persistent id)
            _unicode("storage"),
            b"ctorch\nLongStorage\n",
            _unicode("0"),  # the storage's record: data/0
            _unicode("cpu"),
            _int(numel),
            b"tQ",  # TUPLE, BINPERSID
            _int(0),  # storage offset
            _int(numel) + b"\x85",  # size (TUPLE1)
            _int(1) + b"\x85",  # stride (TUPLE1)
            b"\x89",  # requires_grad False
            b"ccollections\nOrderedDict\n)R",  # backward hooks: OrderedDict()
            b"tR.",  # TUPLE, REDUCE, STOP
        ]
    )


def _add(z: zipfile.ZipFile, name: str, data: bytes) -> None:
    """One stored record whose data starts on a 64-byte boundary (as torch writes them)."""
    info = zipfile.ZipInfo(f"{_FOLDER}/{name}", date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    header = 30 + len(info.filename.encode())  # a local file header before the data
    pad = -(z.fp.tell() + header + 4) % _ALIGN  # type: ignore[union-attr]
    info.extra = _PAD_TAG + struct.pack("<H", pad) + b"\0" * pad
    z.writestr(info, data)


def write_int64_tensor(values: np.ndarray, path: Path) -> None:
    """Write 1-D ``values`` as the int64 tensor ``torch.save`` would, to ``path``."""
    data = np.ascontiguousarray(values, dtype="<i8").reshape(-1)
    raw = data.tobytes()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        _add(z, "data.pkl", _pickle(int(data.size)))
        _add(z, ".format_version", b"1")
        _add(z, ".storage_alignment", str(_ALIGN).encode())
        _add(z, "byteorder", b"little")
        _add(z, "data/0", raw)
        _add(z, "version", b"3\n")
        _add(z, ".data/serialization_id", hashlib.sha1(raw).hexdigest().encode())
