"""The weight map of a checkpoint: which tensor lives in which shard.

Accepts ``model.safetensors.index.json`` + shards, or safetensors files without
an index (a single ``model.safetensors`` is the common case). Validates the
index against the shard headers before anything else happens, and writes the
text of an index for a new checkpoint.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from mtpconv.checkpoint.safetensors_io import SafetensorsHeader, TensorInfo, read_header
from mtpconv.errors import CheckpointFormatError, SourceError
from mtpconv.gc_pause import paused_gc
from mtpconv.jsonio import dumps_json, read_json

INDEX_NAME = "model.safetensors.index.json"


@dataclass
class CheckpointFiles:
    """Validated headers of every shard and the tensor -> shard map."""

    directory: Path
    index_file: str | None
    index_metadata: dict[str, Any]
    shards: dict[str, SafetensorsHeader]
    weight_map: dict[str, str]
    tensors: dict[str, TensorInfo] = field(init=False)

    def __post_init__(self) -> None:
        self.tensors = {name: self.shards[file].tensors[name] for name, file in self.weight_map.items()}

    @property
    def total_tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def shard_tensors(self, file: str) -> dict[str, TensorInfo]:
        """The tensors the weight map places in ``file``, in header order."""
        return {n: t for n, t in self.shards[file].tensors.items() if self.weight_map.get(n) == file}


def index_text(metadata: Mapping[str, Any], weight_map: Mapping[str, str], total_size: int) -> str:
    """The text of ``model.safetensors.index.json``: ``metadata`` (its ``total_size``
    replaced) and the weight map sorted by tensor name."""
    meta = dict(metadata)
    meta["total_size"] = total_size
    return dumps_json({"metadata": meta, "weight_map": dict(sorted(weight_map.items()))})


def _load_index(path: Path) -> dict[str, Any]:
    doc = read_json(
        path,
        CheckpointFormatError,
        require_object=False,
        reject_duplicate_keys=True,
        remedy="re-export the index",
    )
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise CheckpointFormatError(
            f'{path.name} is not a safetensors index: it needs a "weight_map" object.'
        )
    return doc


def _refuse_link_loop(path: Path, rel: str) -> None:
    """A shard that is a symlink to itself (or a cycle of links) is named as a loop; ``exists``
    and ``is_file`` would call it missing."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CheckpointFormatError(
                f"shard {rel!r} is a symlink loop (it links back to itself through "
                f"{os.readlink(path)!r}); replace it with the shard file or a link to it."
            ) from None


def _check_shard_path(directory: Path, rel: str, link_root: Path | None) -> Path:
    """Refuse shard paths that leave the checkpoint (absolute, ``..``, outside links)."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        raise CheckpointFormatError(f"{INDEX_NAME} names an invalid shard path {rel!r}.")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        raise CheckpointFormatError(
            f"{INDEX_NAME} names shard {rel!r}, which is outside the checkpoint directory."
        )
    if str(pure) != rel:
        # "./x", "x/" or "a//b" would alias "x" under a second name: the same file could
        # then be hard-linked and rewritten in one output, writing through to the source.
        raise CheckpointFormatError(
            f"{INDEX_NAME} names shard {rel!r}, which is not a plain relative path; "
            f"write it as {str(pure)!r}."
        )
    path = directory / rel
    _refuse_link_loop(path, rel)
    try:
        root = (link_root or directory).resolve()
        real = Path(os.path.realpath(path))
        exists = path.exists()
        is_file = path.is_file()
    except OSError as exc:
        raise CheckpointFormatError(
            f"{INDEX_NAME} names shard {rel[:80]!r}, which cannot be opened ({exc.strerror or exc})."
        ) from None
    if exists and root not in real.parents and real != root:
        raise CheckpointFormatError(
            f"shard {rel!r} is a link to {real}, outside the checkpoint directory; "
            "copy the file into the checkpoint instead."
        )
    if exists and not is_file:
        raise CheckpointFormatError(
            f"{INDEX_NAME} names shard {rel!r}, which is not a regular file in {directory}."
        )
    return path


def load_checkpoint_files(
    directory: str | os.PathLike[str], *, link_root: Path | None = None
) -> CheckpointFiles:
    """Validate every shard header and the index of a local checkpoint directory.

    ``link_root`` widens where shard symlinks may point (the Hugging Face cache
    keeps snapshot files as links into its blob store).
    """
    with paused_gc():  # ~1M long-lived objects for a large checkpoint (mtpconv.gc_pause)
        return _load_checkpoint_files(Path(directory), link_root)


def _load_checkpoint_files(directory: Path, link_root: Path | None) -> CheckpointFiles:
    if not directory.is_dir():
        raise SourceError(f"{directory} is not a directory.")
    index_path = directory / INDEX_NAME
    if index_path.is_file():
        doc = _load_index(index_path)
        raw_map: dict[str, Any] = doc["weight_map"]
        if not raw_map or any(not isinstance(f, str) for f in raw_map.values()):
            raise CheckpointFormatError(
                f"{INDEX_NAME}: weight_map must map every tensor name to a shard file name."
            )
        files = sorted(set(raw_map.values()))
        shards: dict[str, SafetensorsHeader] = {}
        for rel in files:
            path = _check_shard_path(directory, rel, link_root)
            if not path.is_file():
                raise CheckpointFormatError(
                    f"{INDEX_NAME} names shard {rel!r}, which is missing from {directory}."
                )
            shards[rel] = read_header(path, file=rel)
        weight_map: dict[str, str] = {}
        for name, rel in raw_map.items():
            if name not in shards[rel].tensors:
                raise CheckpointFormatError(
                    f"{INDEX_NAME} puts tensor {name!r} in {rel}, but that shard has no such "
                    "tensor; the index does not match the shards."
                )
            weight_map[name] = rel
        for rel, header in shards.items():
            for name in header.tensors:
                # A tensor the index does not place in this shard would be silently
                # dropped (or duplicated) by a conversion that rewrites the shard.
                if weight_map.get(name) != rel:
                    where = f"puts it in {weight_map[name]}" if name in weight_map else "does not list it"
                    raise CheckpointFormatError(
                        f"{rel} holds tensor {name!r} but {INDEX_NAME} {where}; the index "
                        "does not match the shards. Re-export the index."
                    )
        meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        return CheckpointFiles(directory, INDEX_NAME, dict(meta or {}), shards, weight_map)

    for p in directory.glob("*.safetensors"):
        if p.is_symlink():
            _refuse_link_loop(p, p.name)
    candidates = sorted(p.name for p in directory.glob("*.safetensors") if p.is_file())
    if not candidates:
        raise SourceError(f"{directory} has no safetensors weights (no {INDEX_NAME} and no *.safetensors).")
    shards = {}
    weight_map = {}
    for rel in candidates:
        _check_shard_path(directory, rel, link_root)
        shards[rel] = read_header(directory / rel, file=rel)
        for name in shards[rel].tensors:
            if name in weight_map:
                raise CheckpointFormatError(
                    f"tensor {name!r} is in both {weight_map[name]} and {rel}; "
                    f"add a {INDEX_NAME} or remove the duplicate file."
                )
            weight_map[name] = rel
    return CheckpointFiles(directory, None, {}, shards, weight_map)
