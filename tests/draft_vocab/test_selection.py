"""Which ids a draft vocabulary keeps and the coverage table."""

from __future__ import annotations

import numpy as np
import pytest

from mtpconv.draft_vocab.selection import (
    coverage_sizes,
    coverage_table,
    rank_ids,
    select_draft_ids,
)
from mtpconv.errors import DraftVocabError


def test_select_ties_go_to_lower_ids() -> None:
    counts = np.array([5, 1, 5, 0, 1, 7, 0], np.int64)
    assert select_draft_ids(counts, 3).tolist() == [0, 2, 5]
    assert select_draft_ids(counts, 4).tolist() == [0, 1, 2, 5]
    assert select_draft_ids(counts, 4, forced=[6]).tolist() == [0, 2, 5, 6]
    with pytest.raises(DraftVocabError, match="size=1 is too small"):
        select_draft_ids(counts, 1, forced=[3, 6])


def test_coverage_sizes_fit_the_vocabulary_and_the_split() -> None:
    assert coverage_sizes(48, 10_000, (8192, 16384), None) == [48, 8192]
    assert coverage_sizes(8, 100, (6, 9, 12, 200), 3) == [6, 8, 9, 12]


def test_coverage_table_leaves_out_sizes_too_small_for_the_forced_ids() -> None:
    counts = np.array([4, 0, 3, 2, 1], np.int64)  # 10 tokens
    table = coverage_table(counts, [1, 2, 3], [1], None, rank_ids(counts))
    # size 1 holds only the forced (never seen) id 1; size 2 adds id 0, size 3 id 2.
    assert [(p.size, p.coverage) for p in table] == [(1, 0.0), (2, 0.4), (3, 0.7)]
    assert [p.size for p in coverage_table(counts, [1, 2], [1, 3], None, rank_ids(counts))] == [2]
