"""The one error hierarchy of mtpconv.

Every message is a sentence a user can act on: it names the file, the tensor
and what to do. The CLI turns any `MtpconvError` into a single `Error: ...`
line on stderr and exit code 1.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class MtpconvError(Exception):
    """Base class of every error mtpconv reports to a user."""

    exit_code = 1


class SourceError(MtpconvError):
    """The source checkpoint cannot be found or read."""


class CheckpointFormatError(MtpconvError):
    """A safetensors file, index or config is malformed."""


class LayoutError(MtpconvError):
    """The checkpoint has no recognisable MTP drafter, or it is inconsistent."""


class QuantConfigError(MtpconvError):
    """hf_quant_config.json / config.json cannot be read or rewritten."""


class ConversionError(MtpconvError):
    """A conversion cannot proceed (bad weights, already converted, ...)."""


class OutputError(MtpconvError):
    """The destination cannot be written (exists, inside the source, disk full)."""


class DraftVocabError(MtpconvError):
    """A draft vocabulary, corpus or tokenizer is unusable."""


class ManifestError(MtpconvError):
    """mtpconv.json is missing, malformed or disagrees with the files."""


class PublishError(MtpconvError):
    """The variant cannot be published."""


class Interrupted(MtpconvError):
    """The user interrupted a run (Ctrl-C / SIGTERM); nothing was left half-written."""

    exit_code = 130


@contextmanager
def interruptible(target: object) -> Iterator[None]:
    """The one interrupt path: SIGTERM unwinds like Ctrl-C, and either becomes
    :class:`Interrupted` naming ``target``, after the ``with`` bodies inside have
    removed their temporary files."""
    try:
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    except ValueError:  # not the main thread (embedded use): SIGTERM stays as it was
        previous = None
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; nothing was written to {target}.") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
