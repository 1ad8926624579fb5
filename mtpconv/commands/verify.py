"""``mtpconv verify``: check a ``-mtpfp8`` variant against its manifest (read-only).

The structure first (the manifest, the files it lists, the index, every
safetensors header), then each file: a recorded sha256 is recomputed; a file
recorded only by size and mtime (a linked shard nobody hashed) is checked by
those, and with ``full`` hashed too, reported as consistent but unverifiable.
Reading headers needs no torch, and none is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.variant_check import FileCheck, FileState, check_files, check_variant_structure

if TYPE_CHECKING:
    from mtpconv.progress import ProgressCallback


@dataclass
class VerifyReport:
    """What ``verify`` found, file by file."""

    directory: str
    full: bool
    files: list[FileCheck]

    @property
    def bad(self) -> list[FileCheck]:
        """The files that are missing or no longer match the manifest."""
        return [c for c in self.files if c.state.bad]

    @property
    def ok(self) -> bool:
        return not self.bad

    def to_dict(self) -> dict[str, Any]:
        """The report as ``--json`` prints it."""
        return {
            "directory": self.directory,
            "ok": self.ok,
            "full": self.full,
            "bad": [c.path for c in self.bad],
            "unverifiable": [c.path for c in self.files if not c.known],
            "files": [
                {"path": c.path, "state": c.state.value, "sha256_recorded": c.known, "sha256": c.sha256}
                for c in self.files
            ],
        }


def verify_variant(
    directory: str | os.PathLike[str], *, full: bool = False, progress: ProgressCallback | None = None
) -> VerifyReport:
    """Check ``directory`` against its ``mtpconv.json``; raise on a structural fault."""
    root = Path(directory)
    manifest = check_variant_structure(root)
    load_checkpoint_files(root)  # every header and the index, validated
    checks = check_files(root, manifest, hash_unhashed=full, progress=progress)
    return VerifyReport(directory=str(root), full=full, files=checks)


__all__ = ["FileState", "VerifyReport", "verify_variant"]
