"""The one error hierarchy of mtpconv.

Every message is a sentence a user can act on: it names the file, the tensor
and what to do. It names the library's own parameters (:class:`Param`), never a
command-line flag: the CLI writes each as its command's flag and turns any
`MtpconvError` into a single `Error: ...` line on stderr and exit code 1. Two
paths are written here once: the interrupt path (:func:`sigterm_interrupts`,
:func:`interrupted`, :func:`interruptible`) and the Hub-error map
(:func:`hub_errors`), which every huggingface_hub call goes through.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Param:
    """A parameter of a library call, named in an error message.

    ``name`` is the keyword of the public function the caller called (``size``,
    ``force``, ``text_field``); ``value``, when given, is the value the message is about
    or a placeholder of what to pass. A library caller reads ``size=66``,
    ``force=True``, ``repo_id='USER/NAME'`` or a bare ``text_field``; the command line
    writes the flag its running command declares for the parameter of that name
    instead (``--size 66``, ``--force``, ``--repo-id USER/NAME``, ``--text-field``).
    """

    name: str
    value: bool | int | float | str | os.PathLike[str] | None = None

    def __str__(self) -> str:
        if self.value is None:
            return self.name
        return f"{self.name}={self.value!r}" if isinstance(self.value, str) else f"{self.name}={self.value}"


class MtpconvError(Exception):
    """Base class of every error mtpconv reports to a user.

    The message is given in parts: text, and the :class:`Param` s it names.
    ``str(error)`` writes each parameter as a library caller passes it;
    :meth:`render` lets the command line write each as its flag.
    """

    exit_code = 1

    def __init__(self, *parts: str | Param) -> None:
        super().__init__(*parts)
        self.parts = parts

    def __str__(self) -> str:
        return self.render(str)

    def render(self, spell: Callable[[Param], str]) -> str:
        """The message with each parameter it names written by ``spell``."""
        return "".join(part if isinstance(part, str) else spell(part) for part in self.parts)


class SourceError(MtpconvError):
    """The source checkpoint cannot be found or read."""


class CheckpointFormatError(MtpconvError):
    """A safetensors file, index or config is malformed."""


class LayoutError(MtpconvError):
    """The checkpoint has no recognisable MTP drafter, or it is inconsistent."""


class UnknownFamilyError(LayoutError):
    """The checkpoint declares (or holds) an MTP drafter that no family row of mtpconv knows."""


class QuantConfigError(MtpconvError):
    """hf_quant_config.json / config.json cannot be read or rewritten."""


class ConversionError(MtpconvError):
    """A conversion cannot proceed (bad weights, already converted, ...)."""


class OutputError(MtpconvError):
    """The destination cannot be written (exists, inside the source, disk full)."""


class DraftVocabError(MtpconvError):
    """A draft vocabulary, corpus or tokenizer is unusable."""


class DraftVocabUsageError(DraftVocabError):
    """A build-draft-vocab request that cannot work (a bad prompts line, weight or pairing): exit 2."""

    exit_code = 2


class ManifestError(MtpconvError):
    """mtpconv.json is missing, malformed or disagrees with the files."""


class VerifyError(MtpconvError):
    """A directory is not the complete, unmodified variant its manifest describes
    (``verify``; ``publish`` checks the same before it uploads)."""


class PublishError(MtpconvError):
    """The variant cannot be published."""


class DraftWindowError(MtpconvError):
    """A draft attention window is not below the model's max context: a usage error."""

    exit_code = 2


class EvalError(MtpconvError):
    """``mtpconv eval`` cannot serve the rows (no vLLM, not a variant, a row's process failed)."""


class EvalUsageError(EvalError):
    """An eval request that cannot work (a bad batch list, row name or engine argument): exit 2."""

    exit_code = 2


class Interrupted(MtpconvError):
    """The user interrupted a run (Ctrl-C / SIGTERM); nothing was left half-written."""

    exit_code = 130


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """The one SIGTERM path: inside the block SIGTERM unwinds like Ctrl-C (a
    ``KeyboardInterrupt``), so every ``with`` body removes its temporary files; the
    previous handler comes back after. Off the main thread (embedded use) SIGTERM stays
    as it was."""
    try:
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    except ValueError:  # not the main thread
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def interrupted(target: object | None = None) -> Interrupted:
    """The one interrupt message: what was not written (``target``), or that nothing was
    left half-written."""
    if target is None:
        return Interrupted("interrupted; nothing was left half-written.")
    return Interrupted(f"interrupted; nothing was written to {target}.")


@contextmanager
def interruptible(target: object) -> Iterator[None]:
    """Ctrl-C or SIGTERM (:func:`sigterm_interrupts`) inside the block becomes
    :class:`Interrupted` naming ``target``, after the ``with`` bodies inside have
    removed their temporary files."""
    with sigterm_interrupts():
        try:
            yield
        except KeyboardInterrupt:
            raise interrupted(target) from None


# huggingface_hub's HTTP client has changed with its major versions (requests,
# then httpx, then httpx2); these are each client's "the server could not be
# talked to" errors. Only modules already imported are consulted: an exception
# of one of these classes means its module is loaded.
_TRANSPORT_ERRORS = {
    "httpx2": ("TransportError",),
    "httpx": ("TransportError",),
    "requests": ("ConnectionError", "Timeout"),
}
_HUB_MODULES = ("huggingface_hub", *_TRANSPORT_ERRORS)
_LOGIN_HINT = " Log in with `hf auth login` or set HF_TOKEN."
_FORBIDDEN_HINT = " Your token cannot write there; check its permissions and the namespace."


@contextmanager
def hub_errors(
    step: str,
    *,
    repo_id: str | None = None,
    revision: str | None = None,
    token: str | None = None,
    error: type[MtpconvError] = SourceError,
) -> Iterator[None]:
    """The one Hub-error map: a huggingface_hub failure inside the block becomes
    one ``error`` sentence, ``"<step> failed: <why>."``, with a hint where there is
    one; the token (``token`` and the one huggingface_hub would use) never appears.

    ``step`` says what was being done and names the repo; ``repo_id`` and
    ``revision`` fill in the reasons that need them. A connection failure names the
    endpoint and ends the command at once (callers make no further Hub call).
    """
    try:
        yield
    except MtpconvError:
        raise
    except Exception as exc:
        reason = _hub_failure_reason(exc, repo_id=repo_id, revision=revision)
        if reason is None:
            raise
        raise error(_redact(f"{step} failed: {reason}", token)) from None


def _hub_failure_reason(
    exc: BaseException, *, repo_id: str | None = None, revision: str | None = None
) -> str | None:
    """Why a huggingface_hub call failed, as the end of a sentence; None when
    ``exc`` is not a Hub, network or file failure (a bug: let it surface)."""
    from huggingface_hub import constants
    from huggingface_hub import errors as hf

    repo = repo_id or "the repo"
    endpoint = constants.ENDPOINT
    status = getattr(getattr(exc, "response", None), "status_code", None)
    detail = " ".join(str(exc).split()).rstrip(".: ") or type(exc).__name__
    # Subclasses before their bases: GatedRepoError is a RepositoryNotFoundError,
    # LocalEntryNotFoundError an EntryNotFoundError, OfflineModeIsEnabled a ConnectionError.
    if isinstance(exc, hf.GatedRepoError):
        return f"{repo} is gated: accept its terms on the Hub and set HF_TOKEN."
    if isinstance(exc, hf.RepositoryNotFoundError):
        return f"Hub repo {repo} was not found (or needs a token: set HF_TOKEN)."
    if isinstance(exc, hf.RevisionNotFoundError):
        return f"revision {revision!r} does not exist in {repo}."
    if isinstance(exc, hf.LocalEntryNotFoundError):
        why = (
            "HF_HUB_OFFLINE is set"
            if constants.HF_HUB_OFFLINE
            else f"the Hub at {endpoint} cannot be reached"
        )
        return f"{repo} is not in the local Hugging Face cache and {why}."
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return f"HF_HUB_OFFLINE is set, so the Hub at {endpoint} is not contacted; unset it."
    if _is_transport_error(exc):
        return (
            f"cannot reach the Hub at {endpoint} ({detail}); check the network or "
            "HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use only the local cache."
        )
    if isinstance(exc, hf.LocalTokenNotFoundError) or status == 401:
        return f"{detail}.{_LOGIN_HINT}"
    if status == 403:
        return f"{detail}.{_FORBIDDEN_HINT}"
    if isinstance(exc, hf.HfHubHTTPError):
        return f"the Hub refused it: {detail}."
    if isinstance(exc, OSError | ValueError) or type(exc).__module__.split(".")[0] in _HUB_MODULES:
        return f"{detail}."
    return None


def _is_transport_error(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    for module_name, names in _TRANSPORT_ERRORS.items():
        module = sys.modules.get(module_name)
        if module is None:
            continue
        classes = tuple(c for n in names if isinstance(c := getattr(module, n, None), type))
        if classes and isinstance(exc, classes):
            return True
    return False


def _redact(text: str, token: str | None) -> str:
    from huggingface_hub import get_token

    for secret in {token, get_token()}:
        if secret:
            text = text.replace(secret, "***")
    return text
