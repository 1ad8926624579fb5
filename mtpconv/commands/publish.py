"""``mtpconv publish``: upload a verified ``-mtpfp8`` variant to the Hugging Face Hub.

Every Hub call goes through the one object :func:`make_api` returns (an
``HfApi``; tests replace it) and through the one Hub-error map
(:func:`mtpconv.errors.hub_errors`). :func:`plan_publish` verifies the directory
against its manifest and decides the commit offline (its only possible Hub call
is ``whoami``); :func:`upload_plan` creates the repo and lands the whole variant
in one ``create_commit``, so a reader never sees new shards with an old manifest.
The model card is generated in memory: the user's directory is never written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol

from mtpconv import __version__
from mtpconv.errors import Param, PublishError, hub_errors
from mtpconv.manifest import EVAL_REPORT_NAME, MANIFEST_NAME, Manifest
from mtpconv.model_card import CARD_NAME, build_model_card
from mtpconv.units import human_bytes
from mtpconv.variant_check import check_variant_structure, verify_variant_digests

if TYPE_CHECKING:
    from mtpconv.progress import ProgressCallback

VARIANT_SUFFIX = "-mtpfp8"
USER_PLACEHOLDER = "<your-username>"
# What an error asks for when the repo id is missing or malformed.
_REPO_ID_TO_PASS = Param("repo_id", "USER/NAME")


class HubApi(Protocol):
    """The subset of ``huggingface_hub.HfApi`` that publish uses (the test seam)."""

    def whoami(self, token: str | None = None) -> dict[str, Any]: ...

    def create_repo(
        self, repo_id: str, *, token: str | None, private: bool | None, exist_ok: bool
    ) -> Any: ...

    def repo_info(self, repo_id: str, *, token: str | None) -> Any: ...

    def create_branch(self, repo_id: str, *, branch: str, token: str | None, exist_ok: bool) -> None: ...

    def create_commit(
        self,
        repo_id: str,
        operations: Iterable[Any],
        *,
        commit_message: str,
        token: str | None,
        revision: str | None,
        create_pr: bool | None,
    ) -> Any: ...


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
    sha256: str | None = None  # computed while verifying: the upload does not hash it again


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

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``publish --dry-run --json`` prints it."""
        return {
            "directory": str(self.directory),
            "repo_id": self.repo_id,
            "private": self.private,
            "revision": self.revision,
            "create_pr": self.create_pr,
            "commit_message": self.commit_message,
            "total_bytes": self.total_bytes,
            "files": [
                {
                    "path": item.path_in_repo,
                    "size": item.size,
                    "generated": item.local is None,
                    "sha256": item.sha256,
                }
                for item in self.items
            ],
            "card": self.card,
            "dry_run": True,
        }


@dataclass
class PublishResult:
    """Where the upload of a plan landed (URLs as the Hub returned them)."""

    plan: PublishPlan
    repo_url: str | None = None
    commit_url: str | None = None
    pr_url: str | None = None

    @property
    def url(self) -> str:
        """The most specific place the upload landed: the pull request, the commit, the repo."""
        return self.pr_url or self.commit_url or self.repo_url or self.plan.repo_id

    def to_dict(self) -> dict[str, Any]:
        """The result as ``publish --json`` prints it: the plan, uploaded, and its URLs."""
        return {
            **self.plan.to_dict(),
            "dry_run": False,
            "url": self.url,
            "repo_url": self.repo_url,
            "commit_url": self.commit_url,
            "pr_url": self.pr_url,
        }


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
            f"{MANIFEST_NAME} records neither a source repo id nor a source path; pass ",
            _REPO_ID_TO_PASS,
            ".",
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
    base_model: str | None = None,
    offline: bool = False,
    api: HubApi | None = None,
    notify: Callable[[str], None] | None = None,
    progress: ProgressCallback | None = None,
) -> PublishPlan:
    """Verify ``directory`` and decide the commit: repo id, files, card, message.

    The structure is checked before any Hub call, the sha256s after the username
    is known (fail fast on auth). The only Hub call is ``whoami``, when the repo id
    needs your username; with ``offline`` it is skipped and the id shows
    ``<your-username>``. ``base_model``: the source's Hub repo id for the card's
    ``base_model`` (a local source records none).
    """
    if base_model is not None:
        validate_hub_repo_id(base_model, Param("base_model", "ID"))
    root = Path(directory)
    manifest = check_variant_structure(root)
    target = repo_id or default_repo_name(manifest)
    if "/" not in target:
        if offline:
            target = f"{USER_PLACEHOLDER}/{target}"
        else:
            hub = api or make_api()
            with hub_errors(
                f"looking up your Hub username (to publish {target})", token=token, error=PublishError
            ):
                user = hub.whoami(token=token)["name"]
            target = f"{user}/{target}"
    if not target.startswith(f"{USER_PLACEHOLDER}/"):
        _validate_repo_id(target)
    digests = verify_variant_digests(root, manifest, progress)

    kept = keep_card and (root / CARD_NAME).is_file()
    if keep_card and not kept and notify is not None:
        notify(f"{root} has no {CARD_NAME} to keep; generating the model card.")
    card = None if kept else build_model_card(root, manifest, target, base_model=base_model)
    listed = sorted([*manifest.variant_files, MANIFEST_NAME])
    if (root / EVAL_REPORT_NAME).is_file():  # on the card too (model_card._eval_section)
        listed.append(EVAL_REPORT_NAME)
    items = [
        UploadItem(rel, (root / rel).stat().st_size, root / rel, digests.get(rel))
        for rel in listed
        if rel != CARD_NAME
    ]
    if card is None:
        items.append(UploadItem(CARD_NAME, (root / CARD_NAME).stat().st_size, root / CARD_NAME))
    else:
        items.append(UploadItem(CARD_NAME, len(card.encode("utf-8")), None))
    return PublishPlan(
        directory=root,
        repo_id=target,
        items=items,
        card=card,
        private=private,
        revision=revision,
        create_pr=create_pr,
        commit_message=commit_message or f"Upload {target.split('/')[-1]} (mtpconv {__version__})",
    )


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
    hub = api or make_api()
    say = notify or (lambda _m: None)
    from huggingface_hub import CommitOperationAdd

    repo_id = plan.repo_id

    def step(what: str) -> AbstractContextManager[None]:
        return hub_errors(what, repo_id=repo_id, revision=plan.revision, token=token, error=PublishError)

    with step(f"creating repo {repo_id}"):
        repo_url = hub.create_repo(repo_id, token=token, private=plan.private, exist_ok=True)
    if plan.private:
        # create_repo(exist_ok=True) leaves an existing public repo public.
        with step(f"reading the settings of {repo_id}"):
            is_private = bool(getattr(hub.repo_info(repo_id, token=token), "private", False))
        if not is_private:
            raise PublishError(
                f"{repo_id} already exists and is public; ",
                Param("private", True),
                " would not change that. Make it private on the Hub first, or publish without ",
                Param("private", True),
                ".",
            )
    rev = plan.revision
    if rev and rev != "main" and not rev.startswith("refs/"):
        with step(f"creating branch {rev} in {repo_id}"):
            hub.create_branch(repo_id, branch=rev, token=token, exist_ok=True)

    operations = []
    for item in plan.items:
        op = CommitOperationAdd(
            path_in_repo=item.path_in_repo,
            path_or_fileobj=str(item.local) if item.local is not None else (plan.card or "").encode("utf-8"),
        )
        if item.sha256 is not None:  # verified against the manifest: hash each file once
            op.upload_info.sha256 = bytes.fromhex(item.sha256)
        operations.append(op)
    say(
        f"Uploading {len(plan.items)} files ({human_bytes(plan.total_bytes)}) to {repo_id}"
        + (f" @ {rev}" if rev else "")
        + (" as a pull request" if plan.create_pr else "")
        + "."
    )
    with step(f"uploading to {repo_id}"), _progress_bars(show_progress):
        info = hub.create_commit(
            repo_id,
            operations,
            commit_message=plan.commit_message,
            token=token,
            revision=rev,
            create_pr=plan.create_pr,
        )
    return PublishResult(
        plan,
        repo_url=str(repo_url),
        commit_url=_str_attr(info, "commit_url"),
        pr_url=_str_attr(info, "pr_url"),
    )


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


def _validate_repo_id(repo_id: str) -> None:
    validate_hub_repo_id(repo_id, _REPO_ID_TO_PASS)


def repo_id_problem(repo_id: str) -> str | None:
    """Why ``repo_id`` is not a valid Hub repo id, as a clause (huggingface_hub's own rule,
    through its public ``validate_repo_id``); None when it is valid. The one repo-id check:
    the CLI's ``--base-model`` and :func:`validate_hub_repo_id` both use it."""
    from huggingface_hub.errors import HFValidationError

    # Public (huggingface_hub.utils.__all__), but that list is built lazily, out of mypy's sight.
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        return f"{repo_id!r} is not a valid Hub repo id ({exc})"
    return None


def validate_hub_repo_id(repo_id: str, param: Param) -> None:
    """Raise `PublishError` unless ``repo_id`` is a valid Hub repo id (``param``: what to pass)."""
    problem = repo_id_problem(repo_id)
    if problem is not None:
        raise PublishError(f"{problem}; pass ", param, ".")


def _str_attr(obj: Any, name: str) -> str | None:
    value = getattr(obj, name, None)
    return str(value) if value else None
