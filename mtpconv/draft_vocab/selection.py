"""Which ids a draft vocabulary keeps, and how much of a count they cover.

The K most frequent ids are kept (ties: lower id first), always including the
forced ones (every added/special token and every EOS id).

With ``balance_tp=N`` the vocabulary ``[0, V)`` (V = ``vocab_size`` of config.json)
is cut into N contiguous shards ``[i*ceil(V/N), min((i+1)*ceil(V/N), V))`` and each
shard gets exactly K/N ids, so rank i of a tensor-parallel draft head holds rows
whose ids all lie in its own shard of the full head. vLLM pads the vocabulary to a
multiple of 64 before splitting it; when V is a multiple of 64*N (as for the Qwen
family) the two rules give the same shards.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from mtpconv.draft_vocab.counting import IntArray
from mtpconv.errors import DraftVocabError, Param

DEFAULT_COVERAGE_SIZES: tuple[int, ...] = (8192, 16384, 32768, 65536)


@dataclass
class CoveragePoint:
    """Share of counted tokens covered by the top ``size`` ids."""

    size: int
    coverage: float


def rank_ids(counts: IntArray) -> IntArray:
    """All ids, most frequent first; equal counts by ascending id."""
    order: IntArray = np.lexsort((np.arange(counts.size), -counts)).astype(np.int64)
    return order


def select_draft_ids(
    counts: IntArray,
    size: int,
    *,
    forced: Iterable[int] = (),
    balance_tp: int | None = None,
    order: IntArray | None = None,
) -> IntArray:
    """The ``size`` ids to keep, sorted ascending: ``forced`` ids plus the most frequent.

    With ``balance_tp=N``, each of N contiguous vocabulary shards (module docstring)
    contributes exactly ``size // N`` ids, its forced ones included.
    """
    vocab_size = int(counts.size)
    if not 1 <= size <= vocab_size:
        raise DraftVocabError(Param("size", size), f" must be between 1 and vocab_size {vocab_size}.")
    forced_ids = np.unique(np.asarray(list(forced), dtype=np.int64))
    if forced_ids.size and (forced_ids[0] < 0 or forced_ids[-1] >= vocab_size):
        raise DraftVocabError(f"forced ids must lie in [0, {vocab_size}).")
    if order is None:
        order = rank_ids(counts)
    free = order[~np.isin(order, forced_ids)]
    if balance_tp is None:
        if forced_ids.size > size:
            raise DraftVocabError(
                f"the tokenizer has {forced_ids.size} special/added and EOS tokens, which must all be kept; ",
                Param("size", size),
                " is too small for them.",
            )
        chosen = np.concatenate([forced_ids, free[: size - forced_ids.size]])
        return np.sort(chosen)
    if balance_tp < 1 or size % balance_tp:
        raise DraftVocabError(
            Param("size", size),
            " is not divisible by ",
            Param("balance_tp", balance_tp),
            f"; pick a multiple of {balance_tp}.",
        )
    quota = size // balance_tp
    shard = math.ceil(vocab_size / balance_tp)
    parts = []
    for i in range(balance_tp):
        lo, hi = i * shard, min((i + 1) * shard, vocab_size)
        in_shard = forced_ids[(forced_ids >= lo) & (forced_ids < hi)]
        if hi - lo < quota or in_shard.size > quota:
            reason = (
                f"has only {max(hi - lo, 0)} ids"
                if hi - lo < quota
                else f"holds {in_shard.size} special/EOS ids"
            )
            raise DraftVocabError(
                "with ",
                Param("balance_tp", balance_tp),
                f", vocabulary shard {i} [{lo}, {hi}) {reason} but must get {quota} of the {size}; "
                "choose another ",
                Param("size"),
                " or ",
                Param("balance_tp"),
                ".",
            )
        rest = free[(free >= lo) & (free < hi)]
        parts += [in_shard, rest[: quota - in_shard.size]]
    return np.sort(np.concatenate(parts))


def coverage_of(counts: IntArray, ids: IntArray) -> float:
    """Share of counted tokens whose id is in ``ids`` (0.0 for an empty count)."""
    total = int(counts.sum())
    return int(counts[ids].sum()) / total if total else 0.0


def coverage_sizes(size: int, vocab_size: int, sizes: Sequence[int], balance_tp: int | None) -> list[int]:
    """Table sizes: ``sizes`` that fit the vocabulary (and the TP split), plus ``size``."""
    keep = {s for s in sizes if 1 <= s <= vocab_size and (not balance_tp or s % balance_tp == 0)}
    return sorted(keep | {size})


def coverage_table(
    counts: IntArray, sizes: list[int], forced: list[int], balance_tp: int | None, order: IntArray
) -> list[CoveragePoint]:
    """Coverage of ``counts`` at each size; sizes too small for ``forced`` are left out."""
    table = []
    for s in sizes:
        try:
            ids = select_draft_ids(counts, s, forced=forced, balance_tp=balance_tp, order=order)
        except DraftVocabError:
            continue  # this size cannot hold the forced ids; the chosen size was checked
        table.append(CoveragePoint(s, coverage_of(counts, ids)))
    return table
