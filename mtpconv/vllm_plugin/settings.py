"""What the drafter should be, read from the checkpoint's ``mtpconv.json``.

Settings come from the manifest, never from environment flags; the one switch is
``MTPCONV_DRAFT_VOCAB=0``, which turns the truncated draft head off for
comparisons. No vLLM import here: this module is plain file handling.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mtpconv.checkpoint.digests import sha256_file
from mtpconv.conversion_options import HeadDtype
from mtpconv.errors import DraftVocabError, ManifestError, hub_errors
from mtpconv.formats.draft_ids import load_draft_vocab_ids
from mtpconv.manifest import MANIFEST_NAME, Manifest, read_manifest
from mtpconv.names import drafter_name

DRAFT_VOCAB_ENV = "MTPCONV_DRAFT_VOCAB"


@dataclass(frozen=True)
class DraftHeadSettings:
    """The truncated draft head: target ids of its rows and its weight format."""

    ids: torch.Tensor  # 1-D int64, sorted ascending
    dtype: HeadDtype
    file: Path | None = None  # the head's own safetensors file (None: in the weights)


@dataclass(frozen=True)
class DrafterSettings:
    """How to build the drafter of one checkpoint."""

    model_dir: Path
    manifest: Manifest
    fp8_modules: frozenset[str]  # normalized "mtp.…" module names, no ".weight"
    head: DraftHeadSettings | None
    scale_layouts: dict[str, str] = field(default_factory=dict)  # "mtp.…" -> stored scale layout
    attention_window: int | None = None  # the manifest's draft_window: sliding window of the drafter


def resolve_model_dir(model: str, revision: str | None = None) -> Path | None:
    """A local directory for ``model`` (a path or a Hub repo id), or None.

    vLLM fetches only weights and configs of a Hub model, so the manifest and the
    ids file are fetched here when they are not in the cache yet (unless
    ``HF_HUB_OFFLINE`` forbids it).
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(model, MANIFEST_NAME, revision=revision)
    if isinstance(cached, str):
        return Path(cached).parent
    if cached is not None:  # the cache knows the repo has no manifest
        return None
    config = try_to_load_from_cache(model, "config.json", revision=revision)
    if not isinstance(config, str):
        return None
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    if constants.HF_HUB_OFFLINE:
        return Path(config).parent
    with hub_errors(
        f"fetching {MANIFEST_NAME} of {model}", repo_id=model, revision=revision, error=ManifestError
    ):
        try:
            return Path(hf_hub_download(model, MANIFEST_NAME, revision=revision)).parent
        except EntryNotFoundError:
            return Path(config).parent


def _ensure_file(model_dir: Path, model: str, rel: str, revision: str | None) -> Path:
    path = model_dir / rel
    if path.is_file() or Path(model).expanduser().is_dir():
        return path
    from huggingface_hub import hf_hub_download

    with hub_errors(f"fetching {rel} of {model}", repo_id=model, revision=revision, error=ManifestError):
        return Path(hf_hub_download(model, rel, revision=revision))


def load_draft_ids(path: Path, expected_sha256: str, vocab_size: int) -> torch.Tensor:
    """The draft vocabulary ids: sha256 checked against the manifest, then the one
    ids-file validator (:func:`~mtpconv.formats.draft_ids.load_draft_vocab_ids`)."""
    if not path.is_file():
        raise ManifestError(
            f"{path} is listed in {MANIFEST_NAME} but missing; "
            "re-run `mtpconv quantize-mtp` or copy the whole variant."
        )
    digest = sha256_file(path)
    if digest != expected_sha256:
        raise ManifestError(
            f"{path} has sha256 {digest}, but {MANIFEST_NAME} records "
            f"{expected_sha256}; the variant was modified after conversion."
        )
    try:
        return load_draft_vocab_ids(path, vocab_size)
    except DraftVocabError as exc:  # the plugin reports every variant fault as a manifest fault
        raise ManifestError(str(exc)) from exc


def draft_vocab_enabled() -> bool:
    """False when ``MTPCONV_DRAFT_VOCAB=0`` asks for the full-vocabulary head."""
    return os.environ.get(DRAFT_VOCAB_ENV, "1").strip() != "0"


def drafter_settings(model: str, revision: str | None, vocab_size: int) -> DrafterSettings | None:
    """The settings for the checkpoint ``model``; None means "behave as stock vLLM"."""
    model_dir = resolve_model_dir(model, revision)
    if model_dir is None:
        return None
    manifest = read_manifest(model_dir)
    if manifest is None:
        return None
    if manifest.drafter.activation_scheme != "dynamic" or manifest.drafter.weight_scheme != "per_tensor":
        raise ManifestError(
            f"{model_dir / MANIFEST_NAME}: drafter scheme {manifest.drafter.weight_scheme}/"
            f"{manifest.drafter.activation_scheme} is not supported by this plugin "
            "(per_tensor/dynamic); upgrade mtpconv."
        )
    head = None
    dv = manifest.draft_vocab
    if dv is not None and draft_vocab_enabled():
        try:
            head_dtype = HeadDtype(dv.head_dtype)
        except ValueError:
            raise ManifestError(
                f"{model_dir / MANIFEST_NAME}: draft head dtype {dv.head_dtype!r} is not fp8 or bf16."
            ) from None
        ids_path = _ensure_file(model_dir, model, dv.file, revision)
        ids = load_draft_ids(ids_path, dv.sha256, vocab_size)
        if ids.numel() != dv.size:
            raise ManifestError(f"{ids_path} holds {ids.numel()} ids, {MANIFEST_NAME} says {dv.size}.")
        head_file = None
        if dv.head_file is not None:
            head_file = _ensure_file(model_dir, model, dv.head_file, revision)
            if not head_file.is_file():
                raise ManifestError(
                    f"{head_file} is listed in {MANIFEST_NAME} but missing; copy the whole variant "
                    "(its mtpconv/ folder too) or re-run `mtpconv quantize-mtp`."
                )
        head = DraftHeadSettings(ids=ids, dtype=head_dtype, file=head_file)
    fp8 = frozenset(drafter_name(n) for n in manifest.drafter.fp8_linears)
    layouts = {drafter_name(n): v for n, v in manifest.drafter.scale_layouts.items()}
    return DrafterSettings(
        model_dir=model_dir,
        manifest=manifest,
        fp8_modules=fp8,
        head=head,
        scale_layouts=layouts,
        attention_window=manifest.draft_window,
    )
