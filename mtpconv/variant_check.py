"""Is a directory a complete, untampered ``-mtpfp8`` variant? (read-only)

Two checks, cheap first: :func:`check_variant_structure` (the manifest, the
files it lists, nothing else present, every indexed shard listed) runs before
any Hub call; :func:`check_files` is the one verifier of files against what a
manifest records (a sha256, or for a linked file nobody hashed, size and mtime).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from mtpconv.checkpoint.digests import sha256_file
from mtpconv.errors import ManifestError, VerifyError
from mtpconv.jsonio import read_json
from mtpconv.manifest import EVAL_REPORT_NAME, MANIFEST_NAME, FileStamp, Manifest, read_manifest
from mtpconv.model_card import CARD_NAME

if TYPE_CHECKING:
    from mtpconv.progress import ProgressCallback

# Never part of a variant and never uploaded (huggingface_hub's upload_folder skips them too).
_IGNORED_DIRS = (".git", ".cache/huggingface")
_INDEX_NAME = "model.safetensors.index.json"
_NAMED = 5  # how many offending files an error message names


class FileState(str, Enum):
    """What checking one file of a variant against its manifest found."""

    OK = "ok"  # its sha256 matches the manifest
    CONSISTENT = "consistent"  # no digest recorded; size and mtime match (hashed with --full)
    CHANGED = "changed"  # its sha256 differs from the manifest
    RESTAMPED = "restamped"  # no digest recorded; its size or mtime differs from the record
    MISSING = "missing"

    def __str__(self) -> str:
        return self.value

    @property
    def bad(self) -> bool:
        return self in (FileState.CHANGED, FileState.RESTAMPED, FileState.MISSING)


@dataclass(frozen=True)
class FileCheck:
    """One file of a variant, checked: ``sha256`` is what was computed (None: not hashed)."""

    path: str
    state: FileState
    sha256: str | None = None
    known: bool = True  # the manifest records its sha256


def bad_files(root: str | os.PathLike[str], manifest: Manifest) -> list[str]:
    """The listed files (sorted) that are missing, changed, or restamped: ``[]`` when intact."""
    return [c.path for c in check_files(root, manifest) if c.state.bad]


def check_files(
    root: str | os.PathLike[str],
    manifest: Manifest,
    *,
    hash_unhashed: bool = False,
    progress: ProgressCallback | None = None,
) -> list[FileCheck]:
    """Every file the manifest lists, checked (sorted by path).

    A file with a recorded sha256 is hashed and compared; a file recorded only by
    size and mtime (``unhashed``) is compared by those, and hashed too with
    ``hash_unhashed`` (its digest then cannot be checked, only reported).
    """
    base = Path(root)
    present = {rel: base / rel for rel in manifest.variant_files if (base / rel).is_file()}
    to_hash = [r for r in present if r in manifest.files or hash_unhashed]
    if progress is not None:
        progress.start("Verifying sha256", sum(present[r].stat().st_size for r in to_hash))
    out = []
    for rel in manifest.variant_files:
        path = present.get(rel)
        known = rel in manifest.files
        if path is None:
            out.append(FileCheck(rel, FileState.MISSING, known=known))
            continue
        if not known and FileStamp.of(path) != manifest.unhashed[rel]:
            out.append(FileCheck(rel, FileState.RESTAMPED, known=False))
            continue
        digest = None
        if known or hash_unhashed:
            digest = sha256_file(path)
            if progress is not None:
                progress.advance(path.stat().st_size)
        if known:
            state = FileState.OK if digest == manifest.files[rel] else FileState.CHANGED
        else:
            state = FileState.CONSISTENT
        out.append(FileCheck(rel, state, digest, known))
    return out


def verify_variant_digests(
    root: Path, manifest: Manifest, progress: ProgressCallback | None
) -> dict[str, str]:
    """The sha256 of every file of the variant; raise naming every file that no longer
    matches the manifest (its sha256, or for a file without one, its size and mtime)."""
    checks = check_files(root, manifest, hash_unhashed=True, progress=progress)
    differ = [c.path for c in checks if c.state is FileState.CHANGED or c.state is FileState.MISSING]
    restamped = [c.path for c in checks if c.state is FileState.RESTAMPED]
    if differ:
        verb = "does" if len(differ) == 1 else "do"
        raise VerifyError(
            f"{names(differ)} in {root} {verb} not match its sha256 in {MANIFEST_NAME}: the "
            "variant was modified after conversion. Re-run `mtpconv quantize-mtp`."
        )
    if restamped:
        verb = "has" if len(restamped) == 1 else "have"
        raise VerifyError(
            f"{names(restamped)} in {root} {verb} another size or mtime than {MANIFEST_NAME} "
            "records (no sha256 was recorded for it): it changed after conversion. "
            "Re-run `mtpconv quantize-mtp`."
        )
    return {c.path: c.sha256 for c in checks if c.sha256 is not None}


def check_variant_structure(root: Path) -> Manifest:
    """The manifest of ``root`` if it is structurally a complete variant; raise naming what is wrong.

    Complete means: ``mtpconv.json`` is valid, every file it lists exists, config.json,
    a safetensors file and every shard of the index are listed, and nothing else is in
    the directory except an unlisted ``README.md`` (publish replaces or keeps the card), the
    ``mtpconv-eval.json`` report of ``mtpconv eval`` (publish puts it on the card and uploads it)
    and the ``.git`` / ``.cache/huggingface`` folders huggingface_hub never uploads.
    The sha256s are checked by :func:`verify_variant_digests`.
    """
    if not root.is_dir():
        raise VerifyError(f"{root} is not a directory.")
    manifest = read_manifest(root)
    if manifest is None:
        raise VerifyError(
            f"{root} has no {MANIFEST_NAME}: it is not an mtpconv variant. "
            "Create one with `mtpconv quantize-mtp SRC DST`."
        )
    files = manifest.variant_files
    where = root / MANIFEST_NAME
    if not files:
        raise ManifestError(f"{where} lists no files; re-run `mtpconv quantize-mtp`.")
    unsafe = [r for r in files if not _is_safe_relpath(r)]
    if unsafe:
        raise ManifestError(f"{where} lists paths outside the variant: {names(unsafe)}.")
    required = ["config.json"] if "config.json" not in files else []
    if not any(r.endswith(".safetensors") for r in files):
        required.append("a .safetensors file")
    if required:
        raise ManifestError(f"{where} does not list {' or '.join(required)}; not a variant.")

    missing = sorted(r for r in files if not (root / r).is_file())
    if missing:
        raise VerifyError(
            f"{root} is incomplete: missing {names(missing)} (listed in "
            f"{MANIFEST_NAME}). Re-run `mtpconv quantize-mtp`."
        )
    extra = sorted(set(_walk(root)) - set(files) - {MANIFEST_NAME, CARD_NAME, EVAL_REPORT_NAME})
    if extra:
        raise VerifyError(
            f"{root} holds files not listed in {MANIFEST_NAME}: {names(extra)}. Remove them; "
            "a variant is exactly the files its manifest lists."
        )
    _check_index(root, files)
    return manifest


def names(paths: list[str]) -> str:
    """The first few of ``paths`` for a message, and how many more there are."""
    shown = ", ".join(paths[:_NAMED])
    return shown + (f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else "")


def _walk(root: Path) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else f"{rel_dir}/"
        dirnames[:] = [d for d in dirnames if f"{prefix}{d}" not in _IGNORED_DIRS]
        for fn in filenames:
            yield f"{prefix}{fn}"


def _check_index(root: Path, files: list[str]) -> None:
    if _INDEX_NAME not in files:
        return
    path = root / _INDEX_NAME
    doc = read_json(path, ManifestError)
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict):
        raise ManifestError(f"{path} cannot be read (it has no weight_map object).")
    unlisted = sorted({str(s) for s in weight_map.values()} - set(files))
    if unlisted:
        raise VerifyError(
            f"{_INDEX_NAME} references shards that {MANIFEST_NAME} does not "
            f"list: {names(unlisted)}. Re-run `mtpconv quantize-mtp`."
        )


def _is_safe_relpath(rel: str) -> bool:
    p = PurePosixPath(rel)
    return (
        bool(rel) and "\\" not in rel and not p.is_absolute() and ".." not in p.parts and rel != MANIFEST_NAME
    )
