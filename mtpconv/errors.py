"""The one error hierarchy of mtpconv.

Every message is a sentence a user can act on: it names the file, the tensor
and what to do. The CLI turns any `MtpconvError` into a single `Error: ...`
line on stderr and exit code 1.
"""

from __future__ import annotations


class MtpconvError(Exception):
    """Base class of every error mtpconv reports to a user."""

    exit_code = 1


class UsageError(MtpconvError):
    """The command line itself is wrong (exit code 2)."""

    exit_code = 2


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
