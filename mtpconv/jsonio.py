"""The one way mtpconv reads and writes small JSON/text files.

Reading: one error policy. A file that cannot be read, is not UTF-8, is not JSON,
is nested too deeply, repeats a key (where that matters) or is not an object
raises the caller's error class with one sentence naming the file and the fault.

Writing: one durable writer. The text goes to a sibling temporary file, is
fsynced and renamed over the target, so a reader sees the old file or the new
one, never half of one; the sha256 of what was written is returned.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtpconv.errors import MtpconvError, OutputError

_TMP_SUFFIX = ".mtpconv-tmp"
# A directory that refuses new files: no permission, immutable, read-only filesystem.
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def no_duplicate_keys(where: object, error: type[MtpconvError]) -> Callable[[list[tuple[str, Any]]], Any]:
    """A ``json`` ``object_pairs_hook`` that refuses a repeated key with one ``error`` sentence."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) == len(pairs):
            return out
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise error(
                    f"{where} lists {key!r} twice (a duplicate key); the file is corrupt. "
                    "Restore or re-export it."
                )
            seen.add(key)
        raise AssertionError("unreachable: a shorter dict has a repeated key")

    return hook


def copy_json(doc: Any) -> Any:
    """A deep copy of a JSON document (dicts, lists, str, numbers, bool, None), through the C
    encoder and decoder: ~10x ``copy.deepcopy`` on a config with ~100k quantized layers."""
    return json.loads(json.dumps(doc))


def read_json(
    path: str | os.PathLike[str],
    error: type[MtpconvError],
    *,
    require_object: bool = True,
    reject_duplicate_keys: bool = False,
    remedy: str = "restore the original file",
) -> Any:
    """Decode a JSON file; any fault is one ``error`` sentence naming ``path``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{p} is not UTF-8 text ({exc.reason}); {remedy}.") from None
    except OSError as exc:
        raise error(f"{p} cannot be read: {exc.strerror or exc}.") from None
    hook = no_duplicate_keys(p, error) if reject_duplicate_keys else None
    try:
        doc = json.loads(text, object_pairs_hook=hook)
    except json.JSONDecodeError as exc:
        raise error(
            f"{p} cannot be read as JSON (not valid JSON at line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg}); {remedy}."
        ) from None
    except RecursionError:
        raise error(f"{p} is nested too deeply to be read; {remedy}.") from None
    if require_object and not isinstance(doc, dict):
        raise error(f"{p} must hold a JSON object, found {type(doc).__name__}; {remedy}.")
    return doc


def dumps_json(doc: Any) -> str:
    """How mtpconv writes JSON: indent 2, key order kept, non-ASCII kept, trailing newline."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def temp_sibling(path: Path) -> Path:
    """The temporary name a durable write of ``path`` uses (beside it, same filesystem)."""
    return path.with_name(f".{path.name}{_TMP_SUFFIX}-{os.getpid()}")


def fsync_file(path: Path) -> None:
    """Flush a written file's data to the disk."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_file_durably(path: str | os.PathLike[str], write: Callable[[Path], None]) -> Path:
    """Let ``write`` fill a temporary sibling, fsync it and rename it over ``path``."""
    target = Path(path)
    tmp = temp_sibling(target)
    try:
        tmp.unlink(missing_ok=True)  # left by a killed run: drop the name, never write through it
        write(tmp)
        fsync_file(tmp)
        os.replace(tmp, target)
    except OSError as exc:
        if exc.errno in _NOT_WRITABLE:
            raise OutputError(
                f"{target.parent} is not writable ({exc.strerror}): {target.name} is replaced "
                "through a new file beside it. Make the directory writable and try again."
            ) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return target


def write_text_durably(path: str | os.PathLike[str], text: str) -> str:
    """Write ``text`` (UTF-8) durably and atomically; return its sha256."""
    data = text.encode("utf-8")

    def write(tmp: Path) -> None:
        with open(tmp, "xb") as f:
            f.write(data)

    write_file_durably(path, write)
    return hashlib.sha256(data).hexdigest()
