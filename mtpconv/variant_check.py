"""Is a directory a complete, untampered ``-mtpfp8`` variant? (read-only)

Two checks, cheap first: :func:`check_variant_structure` (the manifest, the
files it lists, nothing else present, every indexed shard listed) runs before
any Hub call; :func:`changed_files` is the one sha256 verifier of files against
the digests a manifest records.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from mtpconv.checkpoint.digests import sha256_file
from mtpconv.errors import ManifestError, PublishError
from mtpconv.jsonio import read_json
from mtpconv.manifest import MANIFEST_NAME, Manifest, read_manifest
from mtpconv.model_card import CARD_NAME

if TYPE_CHECKING:
    from mtpconv.console import ProgressCallback

# Never part of a variant and never uploaded (huggingface_hub's upload_folder skips them too).
_IGNORED_DIRS = (".git", ".cache/huggingface")
_INDEX_NAME = "model.safetensors.index.json"
_NAMED = 5  # how many offending files an error message names


def changed_files(
    root: str | os.PathLike[str],
    digests: Mapping[str, str],
    progress: ProgressCallback | None = None,
) -> list[str]:
    """Relative paths under ``root`` (sorted) that are missing or whose sha256
    differs from ``digests``; ``progress`` advances by the bytes hashed."""
    base = Path(root)
    present = {rel: base / rel for rel in sorted(digests) if (base / rel).is_file()}
    if progress is not None:
        progress.start("Verifying sha256", sum(p.stat().st_size for p in present.values()))
    bad = []
    for rel in sorted(digests):
        path = present.get(rel)
        if path is None or sha256_file(path) != digests[rel]:
            bad.append(rel)
        if path is not None and progress is not None:
            progress.advance(path.stat().st_size)
    return bad


def verify_variant_digests(root: Path, manifest: Manifest, progress: ProgressCallback | None) -> None:
    """Raise naming every file that no longer matches its sha256 in the manifest."""
    differ = changed_files(root, manifest.files, progress)
    if differ:
        verb = "does" if len(differ) == 1 else "do"
        raise PublishError(
            f"{names(differ)} in {root} {verb} not match its sha256 in {MANIFEST_NAME}: the "
            "variant was modified after conversion. Re-run `mtpconv quantize-mtp`."
        )


def check_variant_structure(root: Path) -> Manifest:
    """The manifest of ``root`` if it is structurally a complete variant; raise naming what is wrong.

    Complete means: ``mtpconv.json`` is valid, every file it lists exists, config.json,
    a safetensors file and every shard of the index are listed, and nothing else is in
    the directory except an unlisted ``README.md`` (publish replaces or keeps the card)
    and the ``.git`` / ``.cache/huggingface`` folders huggingface_hub never uploads.
    The sha256s are checked by :func:`verify_variant_digests`.
    """
    if not root.is_dir():
        raise PublishError(f"{root} is not a directory.")
    manifest = read_manifest(root)
    if manifest is None:
        raise PublishError(
            f"{root} has no {MANIFEST_NAME}: it is not an mtpconv variant. "
            "Create one with `mtpconv quantize-mtp SRC DST` and publish DST."
        )
    files = manifest.files
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
        raise PublishError(
            f"{root} is incomplete: missing {names(missing)} (listed in "
            f"{MANIFEST_NAME}). Re-run `mtpconv quantize-mtp`."
        )
    extra = sorted(set(_walk(root)) - set(files) - {MANIFEST_NAME, CARD_NAME})
    if extra:
        raise PublishError(
            f"{root} holds files not listed in {MANIFEST_NAME}: {names(extra)}. Remove them; "
            "publish uploads exactly the variant the manifest describes."
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


def _check_index(root: Path, files: dict[str, str]) -> None:
    if _INDEX_NAME not in files:
        return
    path = root / _INDEX_NAME
    doc = read_json(path, ManifestError)
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict):
        raise ManifestError(f"{path} cannot be read (it has no weight_map object).")
    unlisted = sorted({str(s) for s in weight_map.values()} - set(files))
    if unlisted:
        raise PublishError(
            f"{_INDEX_NAME} references shards that {MANIFEST_NAME} does not "
            f"list: {names(unlisted)}. Re-run `mtpconv quantize-mtp`."
        )


def _is_safe_relpath(rel: str) -> bool:
    p = PurePosixPath(rel)
    return (
        bool(rel) and "\\" not in rel and not p.is_absolute() and ".." not in p.parts and rel != MANIFEST_NAME
    )
