"""sha256 digests of checkpoint files, and the ones huggingface_hub already knows.

Hashing a 200 GB checkpoint takes minutes; a digest that huggingface_hub has
already recorded (cache blobs are named by it, ``hf download --local-dir`` keeps it
in its metadata) costs nothing. Everything here is read-only.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

_HASH_CHUNK = 8 << 20
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 8 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


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
