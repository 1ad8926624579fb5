"""``mtpconv.json``: the manifest of a ``-mtpfp8`` variant (DESIGN §5).

The plugin reads it to decide how to build the drafter; ``publish`` reads it to
verify that a directory is a complete, untampered variant. Schema (version 1)::

    {
      "format_version": 1,
      "tool": {"name": "mtpconv", "version": "0.1.0"},
      "source": {"path": "...", "repo_id": null, "revision": null,
                 "files": {"model-00001-of-00002.safetensors": "<sha256>", ...}},
      "family": "qwen3_5_moe",
      "drafter": {
        "prefix": "mtp.",                       # checkpoint-name prefix of the drafter
        "fp8_linears": ["mtp.fc", "mtp.layers.0.self_attn.q_proj", ...],
        "activation_scheme": "dynamic",
        "weight_scheme": "per_tensor"
      },
      "draft_window": N,                        # optional: the drafter's attention window
      "draft_vocab": null | {"size": K, "file": "mtp_draft_vocab_ids.pt", "sha256": "...",
                              "head_tensor": "mtp.draft_lm_head.weight", "head_dtype": "fp8"|"bf16",
                              "head_file": "mtpconv/draft_head.safetensors",
                              "coverage": 0.97, "corpus": {...}},
      "quantization_error": {"mtp.fc": {"rel_l2": ..., "max_abs": ..., "amax": ...}, ...},
      "files": {"relative/path": "<sha256>", ...},  # files whose sha256 is known
      "unhashed": {"relative/path": {"size": n, "mtime_ns": t}, ...}
    }

``files`` and ``unhashed`` together list every file of the variant but this one.
A file ``quantize-mtp`` wrote (or whose digest huggingface_hub had already
recorded) is in ``files``; a file it only hard-linked or copied, whose digest
nobody knew, is in ``unhashed`` with its size and mtime: hashing a whole target
checkpoint for the manifest would cost more than the conversion. ``mtpconv
verify`` and ``publish`` check those files by size and mtime (``publish``
hashes them too, for the upload). Manifests without ``unhashed`` (older
variants) hash everything they list.

Names in ``fp8_linears`` are checkpoint names (with any ``model.language_model.``
prefix as stored), without the ``.weight`` suffix.

``draft_window`` is optional and absent unless set (``quantize-mtp --draft-window``,
``set-draft-window``): the plugin then builds the drafter's attention with a
sliding window of N tokens; the target's attention is untouched. It is a
top-level field, not a drafter one, so that an older mtpconv (whose drafter
section rejects unknown fields) still loads the variant and simply drafts with
full attention: the output is the same, only acceptance may differ.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mtpconv import __version__
from mtpconv.errors import DraftWindowError, ManifestError
from mtpconv.jsonio import read_json, write_text_durably

MANIFEST_NAME = "mtpconv.json"
# `mtpconv eval`'s report, kept beside the manifest; publish puts it in the model card.
EVAL_REPORT_NAME = "mtpconv-eval.json"
DRAFT_VOCAB_IDS_NAME = "mtp_draft_vocab_ids.pt"
DRAFT_HEAD_NAME = "mtp.draft_lm_head"
# The truncated head lives in a subdirectory: vLLM loads only root *.safetensors (of the
# index's weight_map when there is one), so stock vLLM serves the full head and never sees it.
DRAFT_HEAD_FILE = "mtpconv/draft_head.safetensors"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class FileStamp:
    """What identifies a file whose digest was not computed: its size and mtime."""

    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> FileStamp:
        """The stamp of ``path`` as it is now (following links)."""
        st = os.stat(path)
        return cls(size=st.st_size, mtime_ns=st.st_mtime_ns)


@dataclass
class DrafterSection:
    prefix: str
    fp8_linears: list[str]
    activation_scheme: str = "dynamic"
    weight_scheme: str = "per_tensor"  # the scale *values*: one per tensor (per expert)
    # how each FP8 linear's scale is stored: "per_channel" [out] | "block_128" (absent: 0-d)
    scale_layouts: dict[str, str] = field(default_factory=dict)
    declaration: str = "exclusion"  # "standard": declared FP8 in the quant config; "exclusion"
    declared_algorithms: dict[str, str] = field(default_factory=dict)  # module -> ModelOpt algo
    kept_bf16: dict[str, str] = field(default_factory=dict)  # drafter linears left BF16 -> why


@dataclass
class DraftVocabSection:
    size: int
    file: str
    sha256: str
    head_tensor: str
    head_dtype: str
    coverage: float | None = None
    corpus: dict[str, Any] | None = None
    head_file: str | None = None  # where the head tensors are (None: in the weights, pre-0.2)


@dataclass
class Manifest:
    source: dict[str, Any]
    family: str
    drafter: DrafterSection
    draft_vocab: DraftVocabSection | None = None
    quantization_error: dict[str, dict[str, float]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    unhashed: dict[str, FileStamp] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    tool: dict[str, str] = field(default_factory=lambda: {"name": "mtpconv", "version": __version__})
    draft_window: int | None = None

    @property
    def variant_files(self) -> list[str]:
        """Every file of the variant the manifest lists (hashed or not), sorted."""
        return sorted({*self.files, *self.unhashed})

    def to_json(self) -> str:
        doc = asdict(self)
        order = [
            "format_version",
            "tool",
            "source",
            "family",
            "drafter",
            "draft_window",
            "draft_vocab",
            "quantization_error",
            "files",
            "unhashed",
        ]
        if not self.unhashed:  # written as older mtpconv wrote it when every digest is known
            order.remove("unhashed")
        if self.draft_window is None:  # no window: the document is what it was before windows
            order.remove("draft_window")
        return json.dumps({k: doc[k] for k in order}, indent=2) + "\n"


def max_context(config: dict[str, Any]) -> int | None:
    """The model's ``max_position_embeddings`` (under ``text_config`` for a VLM), or None."""
    text = config.get("text_config")
    for doc in (text if isinstance(text, dict) else {}, config):
        value = doc.get("max_position_embeddings")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_draft_window(window: int, config: dict[str, Any], where: str) -> int:
    """``window`` if it is a positive int below the max context of ``config`` (read from ``where``)."""
    if window < 1:
        raise DraftWindowError(f"the draft window must be a positive number of tokens, not {window}.")
    limit = max_context(config)
    if limit is None:
        raise DraftWindowError(
            f"{where} has no max_position_embeddings, so a draft window cannot be checked; "
            "add it to config.json or leave the window off."
        )
    if window >= limit:
        raise DraftWindowError(
            f"draft window {window} is not below the model's max context {limit} "
            f"(max_position_embeddings in {where}); pick a smaller window or leave it off."
        )
    return window


def write_manifest(directory: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write ``mtpconv.json`` into ``directory`` (fsynced)."""
    path = Path(directory) / MANIFEST_NAME
    write_text_durably(path, manifest.to_json())
    return path


def parse_manifest(doc: Any, where: str = MANIFEST_NAME) -> Manifest:
    """Validate a decoded ``mtpconv.json`` document into a :class:`Manifest`."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{where} is not a JSON object; re-run `mtpconv quantize-mtp`.")
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise ManifestError(
            f"{where} has format_version {version!r}; this mtpconv reads version "
            f"{FORMAT_VERSION}. Upgrade mtpconv or re-run `mtpconv quantize-mtp`."
        )
    try:
        drafter = DrafterSection(**_typed(doc["drafter"], _DRAFTER_TYPES, "drafter"))
        if not all(isinstance(m, str) for m in drafter.fp8_linears):
            raise TypeError("drafter.fp8_linears must be a list of strings")
        dv = doc.get("draft_vocab")
        draft_vocab = (
            DraftVocabSection(**_typed(dv, _DRAFT_VOCAB_TYPES, "draft_vocab")) if dv is not None else None
        )
        errors = _typed_map(doc.get("quantization_error", {}), "quantization_error")
        for name, stats in errors.items():
            if not isinstance(stats, dict) or not all(_is_number(v) for v in stats.values()):
                raise TypeError(f"quantization_error[{name!r}] must map names to numbers")
        files = _typed_map(doc.get("files", {}), "files")
        if not all(isinstance(v, str) for v in files.values()):
            raise TypeError("files must map paths to sha256 strings")
        unhashed = {rel: _stamp(rel, v) for rel, v in _typed_map(doc.get("unhashed", {}), "unhashed").items()}
        if set(unhashed) & set(files):
            raise TypeError(f"{sorted(set(unhashed) & set(files))[0]} is in both files and unhashed")
        return Manifest(
            source=_typed_map(doc["source"], "source"),
            family=str(doc["family"]),
            drafter=drafter,
            draft_vocab=draft_vocab,
            quantization_error=errors,
            files=files,
            unhashed=unhashed,
            format_version=version,
            tool=_typed_map(doc.get("tool", {}), "tool"),
            draft_window=_draft_window(doc.get("draft_window")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{where} is malformed ({exc}); re-run `mtpconv quantize-mtp`.") from exc


_DRAFTER_TYPES: dict[str, tuple[type, ...]] = {
    "prefix": (str,),
    "fp8_linears": (list,),
    "activation_scheme": (str,),
    "weight_scheme": (str,),
    "scale_layouts": (dict,),
    "declaration": (str,),
    "declared_algorithms": (dict,),
    "kept_bf16": (dict,),
}
_DRAFT_VOCAB_TYPES: dict[str, tuple[type, ...]] = {
    "size": (int,),
    "file": (str,),
    "sha256": (str,),
    "head_tensor": (str,),
    "head_dtype": (str,),
    "coverage": (int, float, type(None)),
    "corpus": (dict, type(None)),
    "head_file": (str, type(None)),
}


def _draft_window(value: Any) -> int | None:
    """The recorded draft window: absent/null, or a positive int."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TypeError(f"draft_window must be a positive integer, not {value!r}")
    return value


def _stamp(rel: str, value: Any) -> FileStamp:
    stamp = _typed(value, _STAMP_TYPES, f"unhashed[{rel!r}]")
    if set(stamp) != set(_STAMP_TYPES):
        raise TypeError(f"unhashed[{rel!r}] needs size and mtime_ns")
    return FileStamp(**stamp)


_STAMP_TYPES: dict[str, tuple[type, ...]] = {"size": (int,), "mtime_ns": (int,)}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _typed_map(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be an object")
    return dict(value)


def _typed(value: Any, types: dict[str, tuple[type, ...]], name: str) -> dict[str, Any]:
    """``value`` as keyword arguments, each field of the expected JSON type."""
    section = _typed_map(value, name)
    for key, item in section.items():
        allowed = types.get(key)
        if allowed is None:
            raise TypeError(f"{name} has an unknown field {key!r}")
        if not isinstance(item, allowed) or (isinstance(item, bool) and bool not in allowed):
            raise TypeError(f"{name}.{key} has the wrong type ({type(item).__name__})")
    return section


def read_manifest(directory: str | os.PathLike[str]) -> Manifest | None:
    """The manifest of ``directory``, or None when it has none."""
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        return None
    doc = read_json(
        path, ManifestError, require_object=False, remedy="convert the source again or restore the variant"
    )
    return parse_manifest(doc, str(path))
