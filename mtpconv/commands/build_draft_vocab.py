"""``build-draft-vocab``: count a corpus with the checkpoint's tokenizer and keep the top K ids.

Writes the ids file (:mod:`mtpconv.formats.draft_ids`: ``IDS.pt``, a 1-D int64
tensor sorted ascending), its JSON sidecar ``IDS.pt.json``
(:mod:`mtpconv.draft_vocab.report`) and, on request, the coverage plot. Every
input is checked before the corpus is read; every file appears atomically.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mtpconv.checkpoint.digests import sha256_file
from mtpconv.corpus import discover_corpus_files
from mtpconv.draft_vocab.counting import IntArray, count_tokens
from mtpconv.draft_vocab.plot import require_matplotlib, write_plot
from mtpconv.draft_vocab.report import DraftVocabReport, EvalCoverage
from mtpconv.draft_vocab.selection import (
    DEFAULT_COVERAGE_SIZES,
    CoveragePoint,
    coverage_of,
    coverage_sizes,
    coverage_table,
    rank_ids,
    select_draft_ids,
)
from mtpconv.draft_vocab.tokenizer import TokenizerInfo, load_tokenizer_info, resolve_tokenizer_source
from mtpconv.errors import DraftVocabError
from mtpconv.formats.draft_ids import save_draft_vocab_ids, sidecar_path
from mtpconv.jsonio import dumps_json, write_text_durably

if TYPE_CHECKING:
    from mtpconv.console import ProgressCallback


def _check_request(
    info: TokenizerInfo,
    size: int,
    max_tokens: int | None,
    balance_tp: int | None,
    forced: list[int],
    out: Path,
) -> None:
    """Every refusal that needs no corpus, so none waits for a count."""
    vocab_size = info.vocab_size
    if not 1 <= size <= vocab_size:
        raise DraftVocabError(f"--size {size} must be between 1 and vocab_size {vocab_size}.")
    if max_tokens is not None and max_tokens < 1:
        raise DraftVocabError(f"--max-tokens {max_tokens} must be at least 1.")
    if balance_tp is not None and (balance_tp < 1 or size % balance_tp):
        raise DraftVocabError(
            f"--size {size} is not divisible by --balance-tp {balance_tp}; pick a multiple of {balance_tp}."
        )
    # A too-small K or an impossible TP split fails on an empty count.
    select_draft_ids(np.zeros(vocab_size, np.int64), size, forced=forced, balance_tp=balance_tp)
    if out.is_dir():
        raise DraftVocabError(f"--output {out} is a directory; give a file name such as ids.pt.")


def _held_out(
    counts: IntArray,
    eval_counts: IntArray,
    table: list[CoveragePoint],
    ids: IntArray,
    forced: list[int],
    balance_tp: int | None,
    order: IntArray,
) -> tuple[float, list[CoveragePoint]]:
    """Held-out coverage of the chosen ids and of the ids chosen at each table size."""
    points = []
    for point in table:
        chosen = select_draft_ids(counts, point.size, forced=forced, balance_tp=balance_tp, order=order)
        points.append(CoveragePoint(point.size, coverage_of(eval_counts, chosen)))
    return coverage_of(eval_counts, ids), points


def build_draft_vocab(
    source: str | os.PathLike[str],
    corpora: Sequence[str | os.PathLike[str]],
    size: int,
    output: str | os.PathLike[str],
    *,
    revision: str | None = None,
    text_field: str = "text",
    max_tokens: int | None = None,
    eval_corpora: Sequence[str | os.PathLike[str]] = (),
    balance_tp: int | None = None,
    plot: str | os.PathLike[str] | None = None,
    progress: ProgressCallback | None = None,
    coverage_table_sizes: Sequence[int] = DEFAULT_COVERAGE_SIZES,
) -> DraftVocabReport:
    """Count ``corpora`` with the tokenizer of ``source`` (a directory or a Hub repo id,
    of which only configs and tokenizer files are fetched), keep the top ``size`` ids,
    write ``output`` (ids), its sidecar (and ``plot``), and return the report.
    """
    directory, described = resolve_tokenizer_source(os.fspath(source), revision)
    info = load_tokenizer_info(directory)
    forced = sorted(set(info.special_ids) | set(info.eos_ids))
    out = Path(output)
    _check_request(info, size, max_tokens, balance_tp, forced, out)
    plot_path = Path(plot) if plot is not None else None
    if plot_path is not None:
        require_matplotlib()
    files = discover_corpus_files(corpora)
    eval_files = discover_corpus_files(eval_corpora) if eval_corpora else []

    vocab_size = info.vocab_size
    start = time.perf_counter()
    counts, corpus = count_tokens(
        info.tokenizer, files, vocab_size, text_field=text_field, max_tokens=max_tokens, progress=progress
    )
    seconds = time.perf_counter() - start
    order = rank_ids(counts)
    ids = select_draft_ids(counts, size, forced=forced, balance_tp=balance_tp, order=order)
    sizes = coverage_sizes(size, vocab_size, coverage_table_sizes, balance_tp)
    table = coverage_table(counts, sizes, forced, balance_tp, order)

    eval_report = None
    eval_counts = None
    if eval_files:
        eval_counts, eval_corpus = count_tokens(
            info.tokenizer,
            eval_files,
            vocab_size,
            text_field=text_field,
            progress=progress,
            description="Counting held-out tokens",
        )
        eval_coverage, eval_table = _held_out(counts, eval_counts, table, ids, forced, balance_tp, order)
        eval_report = EvalCoverage(eval_corpus, eval_coverage, eval_table)

    out.parent.mkdir(parents=True, exist_ok=True)
    save_draft_vocab_ids(ids, out)
    sidecar = sidecar_path(out)
    report = DraftVocabReport(
        output=str(out),
        sidecar=str(sidecar),
        size=size,
        vocab_size=vocab_size,
        coverage=coverage_of(counts, ids),
        coverage_table=table,
        corpus=corpus,
        tokenizer={"file": info.path.name, "sha256": info.sha256},
        special_ids=info.special_ids,
        eos_ids=info.eos_ids,
        source=described,
        ids_sha256=sha256_file(out),
        balance_tp=balance_tp,
        eval=eval_report,
        plot=str(plot_path) if plot_path is not None else None,
        seconds=seconds,
        tokens_per_second=corpus.tokens / seconds if seconds > 0 else 0.0,
        ids=[int(i) for i in ids],
    )
    write_text_durably(sidecar, dumps_json(report.sidecar_dict()))
    if plot_path is not None:
        plot_path.parent.mkdir(parents=True, exist_ok=True)
        write_plot(plot_path, counts, order, size, eval_counts)
    return report
