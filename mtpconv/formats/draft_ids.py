"""The draft-vocabulary ids file: one contract for build-draft-vocab, quantize-mtp and the plugin.

DESIGN §5: a non-empty 1-D ``torch.int64`` tensor, strictly ascending (sorted,
no duplicates), every id in ``[0, vocab_size)``, in ``torch.save``'s file format and
always read back with ``weights_only=True`` (so a file never runs pickled code).
Such a file is also a valid SGLang ``--speculative-token-map``. Its JSON sidecar
(what was counted, how well it covers) sits next to it: ``IDS.pt`` ->
``IDS.pt.json``.

Every refusal is a :class:`~mtpconv.errors.DraftVocabError` naming the file;
callers with their own error class (the vLLM plugin) map that one type.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mtpconv.errors import DraftVocabError
from mtpconv.formats.torch_file import write_int64_tensor
from mtpconv.jsonio import write_file_durably

if TYPE_CHECKING:
    import numpy.typing as npt
    import torch


def sidecar_path(ids_path: str | os.PathLike[str]) -> Path:
    """The JSON sidecar next to an ids file: ``IDS.pt`` -> ``IDS.pt.json``."""
    path = Path(ids_path)
    return path.with_name(path.name + ".json")


def save_draft_vocab_ids(ids: npt.NDArray[np.int64] | torch.Tensor, path: str | os.PathLike[str]) -> Path:
    """Write ids as a 1-D int64 tensor sorted ascending in ``torch.save``'s format,
    atomically (:mod:`mtpconv.formats.torch_file`: no torch needed to write it)."""
    values = np.sort(np.asarray(ids, dtype=np.int64).reshape(-1))
    out = Path(path)
    write_file_durably(out, lambda tmp: write_int64_tensor(values, tmp))
    return out


def load_draft_vocab_ids(path: str | os.PathLike[str], vocab_size: int) -> torch.Tensor:
    """Load and validate a draft-vocabulary ids file; never executes pickled code.

    Accepts only a non-empty 1-D int64 tensor, strictly ascending (so no
    duplicates), with every id in ``[0, vocab_size)``; anything else raises
    :class:`~mtpconv.errors.DraftVocabError` naming ``path``.
    """
    import torch

    p = Path(path)
    if not p.is_file():
        raise DraftVocabError(f"draft vocabulary file {p} does not exist.")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refusals and corrupt files alike
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DraftVocabError(
            f"draft vocabulary file {p} is not a plain tensor saved by torch.save; refused to "
            f"load it ({first})."
        ) from exc
    if not isinstance(obj, torch.Tensor):
        raise DraftVocabError(
            f"draft vocabulary file {p} holds a {type(obj).__name__}, not a tensor of token ids."
        )
    if obj.layout != torch.strided or obj.dim() != 1:
        raise DraftVocabError(
            f"draft vocabulary file {p} holds a tensor of shape {tuple(obj.shape)}; "
            "expected a 1-D tensor of token ids."
        )
    if obj.dtype != torch.int64:
        raise DraftVocabError(f"draft vocabulary file {p} holds {obj.dtype} ids; expected torch.int64.")
    if obj.numel() == 0:
        raise DraftVocabError(f"draft vocabulary file {p} is empty (no token ids).")
    diffs = obj[1:] - obj[:-1]
    if bool((diffs == 0).any()):
        dup = int(obj[1:][diffs == 0][0])
        raise DraftVocabError(f"draft vocabulary file {p} lists id {dup} more than once.")
    if bool((diffs < 0).any()):
        raise DraftVocabError(f"draft vocabulary file {p} is not sorted ascending.")
    lo, hi = int(obj[0]), int(obj[-1])
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise DraftVocabError(
            f"draft vocabulary file {p} has id {bad}, outside the vocabulary [0, {vocab_size})."
        )
    return obj.contiguous()
