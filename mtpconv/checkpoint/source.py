"""Where a checkpoint comes from: a local directory or a Hugging Face Hub repo id.

Repo ids resolve through huggingface_hub's cache, so ``HF_HOME``, ``HF_TOKEN``
and ``HF_HUB_OFFLINE`` behave as everywhere else in the ecosystem. ``inspect``
of a repo id reads configs and safetensors headers remotely (range requests),
never tensor data.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mtpconv.checkpoint.index import CheckpointFiles, load_checkpoint_files
from mtpconv.checkpoint.safetensors_io import SafetensorsHeader, TensorInfo
from mtpconv.errors import SourceError

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


@contextmanager
def _hub_errors(repo_id: str, revision: str | None) -> Iterator[None]:
    from huggingface_hub import errors as hf_errors

    what = f"{repo_id}" + (f"@{revision}" if revision else "")
    try:
        yield
    except hf_errors.RepositoryNotFoundError:
        raise SourceError(
            f"Hub repo {repo_id} was not found (or needs a token: set HF_TOKEN)."
        ) from None
    except hf_errors.RevisionNotFoundError:
        raise SourceError(f"revision {revision!r} does not exist in {repo_id}.") from None
    except hf_errors.GatedRepoError:
        raise SourceError(f"{repo_id} is gated: accept its terms and set HF_TOKEN.") from None
    except hf_errors.LocalEntryNotFoundError:
        raise SourceError(
            f"{what} is not in the local Hugging Face cache and the Hub cannot be reached "
            "(HF_HUB_OFFLINE is set or there is no network)."
        ) from None
    except hf_errors.HfHubHTTPError as exc:
        raise SourceError(f"the Hub refused {what}: {exc}") from None
    except OSError as exc:
        raise SourceError(f"cannot fetch {what}: {exc}") from None


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
            raise SourceError(f"--revision applies to Hub repo ids, not the local path {spec}.")
        return Source(spec=spec, directory=path)
    if not looks_like_repo_id(spec):
        raise SourceError(f"{spec} is neither a directory nor a Hub repo id (owner/name).")
    from huggingface_hub import snapshot_download

    with _hub_errors(spec, revision):
        snapshot = Path(snapshot_download(
            repo_id=spec, revision=revision,
            allow_patterns=None if allow_patterns is None else list(allow_patterns)))  # fmt: skip
    # Snapshot files are links into the repo's blob store two levels up.
    return Source(spec=spec, directory=snapshot, repo_id=spec, revision=revision,
                  link_root=snapshot.parent.parent)  # fmt: skip


def load_files(source: Source) -> CheckpointFiles:
    """Validated headers of a resolved source."""
    return load_checkpoint_files(source.directory, link_root=source.link_root)


def remote_checkpoint(spec: str, revision: str | None) -> tuple[Source, CheckpointFiles]:
    """Configs (downloaded, small) and safetensors headers (range requests) of a Hub repo."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub import errors as hf_errors

    api = HfApi()
    directory: Path | None = None
    with _hub_errors(spec, revision):
        for name in CONFIG_FILES:
            try:
                got = Path(hf_hub_download(repo_id=spec, filename=name, revision=revision))
            except hf_errors.EntryNotFoundError:
                continue
            directory = directory or got.parent
        meta = api.get_safetensors_metadata(spec, revision=revision)
    if directory is None:
        raise SourceError(f"Hub repo {spec} has no config.json; it is not a model checkpoint.")
    shards: dict[str, SafetensorsHeader] = {}
    for file, fmeta in meta.files_metadata.items():
        tensors = {
            name: TensorInfo(name=name, dtype=t.dtype, shape=tuple(t.shape), file=file,
                             start=t.data_offsets[0], end=t.data_offsets[1])  # fmt: skip
            for name, t in fmeta.tensors.items()
        }
        shards[file] = SafetensorsHeader(file=file, data_start=0, tensors=tensors,
                                         metadata=dict(fmeta.metadata or {}))  # fmt: skip
    weight_map = dict(meta.weight_map)
    files = CheckpointFiles(directory, None, {}, shards, weight_map)
    return Source(spec=spec, directory=directory, repo_id=spec, revision=revision), files
