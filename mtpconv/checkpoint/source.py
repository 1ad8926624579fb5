"""Where a checkpoint comes from: a local directory or a Hugging Face Hub repo id.

Repo ids resolve through huggingface_hub's cache, so ``HF_HOME``, ``HF_TOKEN``
and ``HF_HUB_OFFLINE`` behave as everywhere else in the ecosystem. ``inspect``
of a repo id reads configs and safetensors headers remotely (range requests),
never tensor data.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from mtpconv.checkpoint.index import CheckpointFiles, load_checkpoint_files
from mtpconv.checkpoint.safetensors_io import SafetensorsHeader, TensorInfo
from mtpconv.errors import Param, SourceError, hub_errors

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Small files a conversion needs besides the weights (and which inspect reads).
CONFIG_FILES = ("config.json", "hf_quant_config.json", "generation_config.json", "mtpconv.json")


@dataclass(frozen=True)
class Source:
    """A resolved source: always a local directory, plus where it came from."""

    spec: str
    directory: Path
    repo_id: str | None = None
    revision: str | None = None
    link_root: Path | None = None

    def describe(self) -> dict[str, str | None]:
        if self.repo_id:
            return {"repo_id": self.repo_id, "revision": self.revision, "path": None}
        return {"repo_id": None, "revision": None, "path": self.spec}


def looks_like_repo_id(spec: str) -> bool:
    """True when ``spec`` is not an existing path and has the shape ``owner/name``."""
    return not Path(spec).expanduser().exists() and bool(_REPO_ID.match(spec))


def resolve_source(
    spec: str, revision: str | None = None, *, allow_patterns: Collection[str] | None = None
) -> Source:
    """A local directory, or the snapshot of a Hub repo in the HF cache.

    ``allow_patterns`` limits what a repo id downloads (default: everything).
    """
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise SourceError(f"{spec} is a file; give the checkpoint directory.")
        if revision:
            raise SourceError(Param("revision"), f" applies to Hub repo ids, not the local path {spec}.")
        return Source(spec=spec, directory=path)
    if not looks_like_repo_id(spec):
        raise SourceError(f"{spec} is neither a directory nor a Hub repo id (owner/name).")
    from huggingface_hub import snapshot_download

    with hub_errors(f"fetching {_at(spec, revision)}", repo_id=spec, revision=revision):
        snapshot = Path(
            snapshot_download(
                repo_id=spec,
                revision=revision,
                allow_patterns=None if allow_patterns is None else list(allow_patterns),
            )
        )
    # Snapshot files are links into the repo's blob store two levels up.
    return Source(
        spec=spec, directory=snapshot, repo_id=spec, revision=revision, link_root=snapshot.parent.parent
    )


def load_files(source: Source) -> CheckpointFiles:
    """Validated headers of a resolved source."""
    return load_checkpoint_files(source.directory, link_root=source.link_root)


def open_checkpoint(
    spec: str, revision: str | None = None, *, headers_only: bool = False
) -> tuple[Source, CheckpointFiles]:
    """A local directory or a Hub repo id, resolved, with its validated headers.

    With ``headers_only`` a repo id downloads no weights: its configs, and its
    safetensors headers by range requests (:func:`remote_checkpoint`).
    """
    if headers_only and looks_like_repo_id(spec):
        return remote_checkpoint(spec, revision)
    source = resolve_source(spec, revision)
    return source, load_files(source)


def remote_checkpoint(spec: str, revision: str | None) -> tuple[Source, CheckpointFiles]:
    """Configs (downloaded, small) and safetensors headers (range requests) of a Hub repo.

    The first call is one ``model_info`` request, which huggingface_hub does not
    retry: an unreachable Hub ends the command there, instead of in
    ``hf_hub_download``'s retries (about 23 s) for each config file in turn.
    """
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub import errors as hf_errors

    api = HfApi()
    where = _at(spec, revision)
    with hub_errors(f"looking up {where}", repo_id=spec, revision=revision):
        info = api.model_info(spec, revision=revision)
    # Only the config files the repo has: each absent one would cost a request.
    listed = None if info.siblings is None else {s.rfilename for s in info.siblings}
    directory: Path | None = None
    for name in CONFIG_FILES:
        if listed is not None and name not in listed:
            continue
        with hub_errors(f"fetching {name} of {where}", repo_id=spec, revision=revision):
            try:
                got = Path(hf_hub_download(repo_id=spec, filename=name, revision=revision))
            except hf_errors.EntryNotFoundError as exc:
                if isinstance(exc, hf_errors.LocalEntryNotFoundError):
                    raise  # not "absent from the repo": the Hub stopped answering
                continue
        directory = directory or got.parent
    if directory is None:
        raise SourceError(f"Hub repo {spec} has no config.json; it is not a model checkpoint.")
    with hub_errors(f"reading the safetensors headers of {where}", repo_id=spec, revision=revision):
        meta = api.get_safetensors_metadata(spec, revision=revision)
    shards: dict[str, SafetensorsHeader] = {}
    for file, fmeta in meta.files_metadata.items():
        tensors = {
            name: TensorInfo(
                name=name,
                dtype=t.dtype,
                shape=tuple(t.shape),
                file=file,
                start=t.data_offsets[0],
                end=t.data_offsets[1],
            )
            for name, t in fmeta.tensors.items()
        }
        shards[file] = SafetensorsHeader(
            file=file, data_start=0, tensors=tensors, metadata=dict(fmeta.metadata or {})
        )
    weight_map = dict(meta.weight_map)
    files = CheckpointFiles(directory, None, {}, shards, weight_map)
    return Source(spec=spec, directory=directory, repo_id=spec, revision=revision), files


def _at(spec: str, revision: str | None) -> str:
    return spec + (f"@{revision}" if revision else "")
