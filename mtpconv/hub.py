"""Publish a verified ``-mtpfp8`` variant to the Hugging Face Hub.

Every Hub call goes through the one object :func:`make_api` returns (an
``HfApi``); tests replace it. The directory is verified against its manifest
before anything is contacted, the model card is generated in memory (the user's
directory is never written), and the whole variant lands in one commit made with
``HfApi.create_commit``, so a reader never sees a repo with new shards and an old
manifest. huggingface_hub handles large files and shows its own upload progress.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol

from mtpconv import __version__
from mtpconv.checkpoint.digests import sha256_file
from mtpconv.errors import ManifestError, PublishError
from mtpconv.manifest import MANIFEST_NAME, Manifest, read_manifest
from mtpconv.model_card import CARD_NAME, build_model_card, human_bytes

if TYPE_CHECKING:
    from mtpconv.console import ProgressCallback

VARIANT_SUFFIX = "-mtpfp8"
USER_PLACEHOLDER = "<your-username>"
# Never part of a variant and never uploaded (huggingface_hub's upload_folder skips them too).
_IGNORED_DIRS = (".git", ".cache/huggingface")
_INDEX_NAME = "model.safetensors.index.json"
_NAMED = 5  # how many offending files an error message names


class HubApi(Protocol):
    """The subset of ``huggingface_hub.HfApi`` that publish uses (the test seam)."""

    def whoami(self, token: str | None = None) -> dict[str, Any]: ...

    def create_repo(self, repo_id: str, *, token: str | None, private: bool | None,
                    exist_ok: bool) -> Any: ...  # fmt: skip

    def repo_info(self, repo_id: str, *, token: str | None) -> Any: ...

    def create_branch(self, repo_id: str, *, branch: str, token: str | None,
                      exist_ok: bool) -> None: ...  # fmt: skip

    def create_commit(self, repo_id: str, operations: Iterable[Any], *, commit_message: str,
                      token: str | None, revision: str | None,
                      create_pr: bool | None) -> Any: ...  # fmt: skip


def make_api() -> HubApi:
    """The real Hub client. Tests monkeypatch this function."""
    from huggingface_hub import HfApi

    api: HubApi = HfApi(library_name="mtpconv", library_version=__version__)
    return api


@dataclass(frozen=True)
class UploadItem:
    """One file of the commit: ``local`` is None for the generated card."""

    path_in_repo: str
    size: int
    local: Path | None


@dataclass
class PublishPlan:
    """What would be uploaded, where, and how; built offline."""

    directory: Path
    repo_id: str
    items: list[UploadItem]
    card: str | None  # generated card text; None when the directory's README.md is kept
    private: bool
    revision: str | None
    create_pr: bool
    commit_message: str

    @property
    def total_bytes(self) -> int:
        return sum(item.size for item in self.items)


@dataclass
class PublishResult:
    plan: PublishPlan
    dry_run: bool
    repo_url: str | None = None
    commit_url: str | None = None
    pr_url: str | None = None


def verify_variant(directory: str | os.PathLike[str], progress: ProgressCallback | None = None) -> Manifest:
    """The manifest of a complete, untampered variant; raise naming what is wrong.

    Complete means: ``mtpconv.json`` is valid, every file it lists exists with its
    sha256, config.json, a safetensors file and every shard of the index are
    listed, and nothing else is in the directory except an unlisted ``README.md``
    (publish replaces or keeps the card) and the ``.git`` / ``.cache/huggingface``
    folders that huggingface_hub itself never uploads.
    """
    manifest = _check_structure(Path(directory))
    _check_hashes(Path(directory), manifest, progress)
    return manifest


def _check_structure(root: Path) -> Manifest:
    """Everything but the sha256s: cheap, so it runs before any Hub call."""
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
        raise ManifestError(f"{where} lists paths outside the variant: {_names(unsafe)}.")
    required = ["config.json"] if "config.json" not in files else []
    if not any(r.endswith(".safetensors") for r in files):
        required.append("a .safetensors file")
    if required:
        raise ManifestError(f"{where} does not list {' or '.join(required)}; not a variant.")

    missing = sorted(r for r in files if not (root / r).is_file())
    if missing:
        raise PublishError(f"{root} is incomplete: missing {_names(missing)} (listed in "
                           f"{MANIFEST_NAME}). Re-run `mtpconv quantize-mtp`.")  # fmt: skip
    extra = sorted(set(_walk(root)) - set(files) - {MANIFEST_NAME, CARD_NAME})
    if extra:
        raise PublishError(
            f"{root} holds files not listed in {MANIFEST_NAME}: {_names(extra)}. Remove them; "
            "publish uploads exactly the variant the manifest describes."
        )
    _check_index(root, files)
    return manifest


def _check_hashes(root: Path, manifest: Manifest, progress: ProgressCallback | None) -> None:
    files = manifest.files
    if progress is not None:
        progress.start("Verifying sha256", sum((root / r).stat().st_size for r in files))
    differ = []
    for rel in sorted(files):
        if sha256_file(root / rel) != files[rel]:
            differ.append(rel)
        if progress is not None:
            progress.advance((root / rel).stat().st_size)
    if differ:
        verb = "does" if len(differ) == 1 else "do"
        raise PublishError(
            f"{_names(differ)} in {root} {verb} not match its sha256 in {MANIFEST_NAME}: the "
            "variant was modified after conversion. Re-run `mtpconv quantize-mtp`."
        )


def default_repo_name(manifest: Manifest) -> str:
    """``<source repo name>-mtpfp8``; for a local source, the source directory's name."""
    repo = manifest.source.get("repo_id")
    path = manifest.source.get("path")
    if isinstance(repo, str) and repo:
        base = repo.split("/")[-1]
    elif isinstance(path, str) and path:
        base = PurePosixPath(path.replace("\\", "/").rstrip("/")).name
    else:
        raise PublishError(
            f"{MANIFEST_NAME} records neither a source repo id nor a source path; pass --repo-id USER/NAME."
        )
    return base if base.endswith(VARIANT_SUFFIX) else base + VARIANT_SUFFIX


def plan_publish(
    directory: str | os.PathLike[str],
    *,
    repo_id: str | None = None,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    token: str | None = None,
    commit_message: str | None = None,
    keep_card: bool = False,
    offline: bool = False,
    api: HubApi | None = None,
    notify: Callable[[str], None] | None = None,
    progress: ProgressCallback | None = None,
) -> PublishPlan:
    """Verify ``directory`` and decide the commit: repo id, files, card, message.

    The only Hub call is ``whoami``, when the repo id needs your username; with
    ``offline`` that call is skipped and the id shows ``<your-username>``.
    """
    root = Path(directory)
    manifest = _check_structure(root)
    target = repo_id or default_repo_name(manifest)
    if "/" not in target:
        if offline:
            target = f"{USER_PLACEHOLDER}/{target}"
        else:
            hub = api or make_api()
            with _hub_errors("looking up your Hub username", token):
                user = hub.whoami(token=token)["name"]
            target = f"{user}/{target}"
    if not target.startswith(f"{USER_PLACEHOLDER}/"):
        _validate_repo_id(target)
    _check_hashes(root, manifest, progress)

    kept = keep_card and (root / CARD_NAME).is_file()
    if keep_card and not kept and notify is not None:
        notify(f"{root} has no {CARD_NAME} to keep; generating the model card.")
    card = None if kept else build_model_card(root, manifest, target)
    items = [UploadItem(rel, (root / rel).stat().st_size, root / rel)
             for rel in sorted([*manifest.files, MANIFEST_NAME]) if rel != CARD_NAME]  # fmt: skip
    if card is None:
        items.append(UploadItem(CARD_NAME, (root / CARD_NAME).stat().st_size, root / CARD_NAME))
    else:
        items.append(UploadItem(CARD_NAME, len(card.encode("utf-8")), None))
    return PublishPlan(
        directory=root, repo_id=target, items=items, card=card, private=private,
        revision=revision, create_pr=create_pr,
        commit_message=commit_message or f"Upload {target.split('/')[-1]} (mtpconv {__version__})",
    )  # fmt: skip


def publish(
    directory: str | os.PathLike[str],
    *,
    repo_id: str | None = None,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    token: str | None = None,
    commit_message: str | None = None,
    dry_run: bool = False,
    keep_card: bool = False,
    api: HubApi | None = None,
    notify: Callable[[str], None] | None = None,
    progress: ProgressCallback | None = None,
    show_progress: bool = True,
) -> PublishResult:
    """:func:`plan_publish`, then :func:`upload_plan` unless ``dry_run``.

    With ``dry_run`` nothing is contacted: the result carries the plan only.
    """
    if not dry_run:
        api = api or make_api()
    plan = plan_publish(
        directory, repo_id=repo_id, private=private, revision=revision, create_pr=create_pr,
        token=token, commit_message=commit_message, keep_card=keep_card, offline=dry_run,
        api=api, notify=notify, progress=progress,
    )  # fmt: skip
    if dry_run:
        return PublishResult(plan, dry_run=True)
    return upload_plan(plan, token=token, api=api, notify=notify, show_progress=show_progress)


def upload_plan(
    plan: PublishPlan,
    *,
    token: str | None = None,
    api: HubApi | None = None,
    notify: Callable[[str], None] | None = None,
    show_progress: bool = True,
) -> PublishResult:
    """Create the repo (and branch), then upload every file of ``plan`` in one commit."""
    if plan.repo_id.startswith(f"{USER_PLACEHOLDER}/"):
        raise PublishError("this plan was made offline and has no Hub username; plan it again.")
    return _upload(plan, api or make_api(), token, notify or (lambda _m: None), show_progress)


def _upload(
    plan: PublishPlan, api: HubApi, token: str | None, say: Callable[[str], None],
    show_progress: bool,
) -> PublishResult:  # fmt: skip
    from huggingface_hub import CommitOperationAdd

    repo_id = plan.repo_id
    with _hub_errors(f"creating repo {repo_id}", token):
        repo_url = api.create_repo(repo_id, token=token, private=plan.private, exist_ok=True)
    if plan.private:
        # create_repo(exist_ok=True) leaves an existing public repo public.
        with _hub_errors(f"reading the settings of {repo_id}", token):
            is_private = bool(getattr(api.repo_info(repo_id, token=token), "private", False))
        if not is_private:
            raise PublishError(
                f"{repo_id} already exists and is public; --private would not change that. "
                "Make it private on the Hub first, or publish without --private."
            )
    rev = plan.revision
    if rev and rev != "main" and not rev.startswith("refs/"):
        with _hub_errors(f"creating branch {rev} in {repo_id}", token):
            api.create_branch(repo_id, branch=rev, token=token, exist_ok=True)

    operations = [
        CommitOperationAdd(path_in_repo=item.path_in_repo,
                           path_or_fileobj=str(item.local) if item.local is not None
                           else (plan.card or "").encode("utf-8"))
        for item in plan.items
    ]  # fmt: skip
    say(
        f"Uploading {len(plan.items)} files ({human_bytes(plan.total_bytes)}) to {repo_id}"
        + (f" @ {rev}" if rev else "")
        + (" as a pull request" if plan.create_pr else "")
        + "."
    )
    with _hub_errors(f"uploading to {repo_id}", token), _progress_bars(show_progress):
        info = api.create_commit(
            repo_id, operations, commit_message=plan.commit_message, token=token,
            revision=rev, create_pr=plan.create_pr,
        )  # fmt: skip
    return PublishResult(
        plan, dry_run=False, repo_url=str(repo_url),
        commit_url=_str_attr(info, "commit_url"), pr_url=_str_attr(info, "pr_url"),
    )  # fmt: skip


def _hub_error_types() -> tuple[type[BaseException], ...]:
    types: tuple[type[BaseException], ...] = (OSError, ValueError)
    from huggingface_hub import errors

    # huggingface_hub >= 1.0 re-exports its HTTP client's base error (transport
    # failures are not OSError there); getattr keeps older versions working.
    http_error = getattr(errors, "HTTPError", None)
    if isinstance(http_error, type) and issubclass(http_error, BaseException):
        types += (http_error,)
    return types


@contextmanager
def _hub_errors(step: str, token: str | None) -> Iterator[None]:
    """Turn a Hub failure into one PublishError sentence that never contains the token."""
    try:
        yield
    except PublishError:
        raise
    except _hub_error_types() as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        hint = ""
        if type(exc).__name__ == "LocalTokenNotFoundError" or status == 401:
            hint = " Log in with `hf auth login` or pass --token."
        elif status == 403:
            hint = " Your token cannot write there; check its permissions and the namespace."
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise PublishError(_redact(f"{step} failed: {message}.{hint}", token)) from None


@contextmanager
def _progress_bars(show: bool) -> Iterator[None]:
    from huggingface_hub.utils.tqdm import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    turn_off = not show and not are_progress_bars_disabled()
    if turn_off:
        disable_progress_bars()
    try:
        yield
    finally:
        if turn_off:
            enable_progress_bars()


def _redact(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def _validate_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils._validators import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError as exc:
        raise PublishError(f"{repo_id!r} is not a valid Hub repo id ({exc}); "
                           "pass --repo-id USER/NAME.") from None  # fmt: skip


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
    import json

    try:
        weight_map = json.loads((root / _INDEX_NAME).read_text(encoding="utf-8"))["weight_map"]
        shards = set(weight_map.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ManifestError(f"{root / _INDEX_NAME} cannot be read ({exc}).") from exc
    unlisted = sorted(s for s in shards if s not in files)
    if unlisted:
        raise PublishError(f"{_INDEX_NAME} references shards that {MANIFEST_NAME} does not "
                           f"list: {_names(unlisted)}. Re-run `mtpconv quantize-mtp`.")  # fmt: skip


def _is_safe_relpath(rel: str) -> bool:
    p = PurePosixPath(rel)
    return bool(rel) and "\\" not in rel and not p.is_absolute() and ".." not in p.parts \
        and rel != MANIFEST_NAME  # fmt: skip


def _names(paths: list[str]) -> str:
    shown = ", ".join(paths[:_NAMED])
    return shown + (f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else "")


def _str_attr(obj: Any, name: str) -> str | None:
    value = getattr(obj, name, None)
    return str(value) if value else None
