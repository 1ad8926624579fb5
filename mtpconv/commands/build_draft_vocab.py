"""``build-draft-vocab``: count a corpus with the checkpoint's tokenizer, or the text the
model itself generates for a prompts file (``generate``, in vLLM), and keep the top K ids.

Writes the ids file (:mod:`mtpconv.formats.draft_ids`: ``IDS.pt``, a 1-D int64
tensor sorted ascending), its JSON sidecar ``IDS.pt.json``
(:mod:`mtpconv.draft_vocab.report`) and, on request, the coverage plot. Every
input is checked before the corpus is read or the model loaded; every file appears
atomically. With both a corpus and prompts, each source's counts are normalised and
mixed: ``generated_weight`` is the share of the generated text in the ranking.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mtpconv.checkpoint.digests import sha256_file
from mtpconv.corpus import discover_corpus_files
from mtpconv.draft_vocab.counting import CorpusStats, IntArray, count_tokens
from mtpconv.draft_vocab.generate import GeneratedCount, SamplingSettings, generate_counts, target_engine
from mtpconv.draft_vocab.plot import require_matplotlib, write_plot
from mtpconv.draft_vocab.prompts import PromptsFile, has_chat_template, read_prompts
from mtpconv.draft_vocab.report import DraftVocabReport, EvalCoverage, GeneratedText
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
from mtpconv.errors import DraftVocabError, DraftVocabUsageError, Param
from mtpconv.formats.draft_ids import save_draft_vocab_ids, sidecar_path
from mtpconv.jsonio import dumps_json, write_text_durably

if TYPE_CHECKING:
    from mtpconv.progress import ProgressCallback

DEFAULT_GENERATED_WEIGHT = 0.5
# Mixed counts stay integers: each source's share of the total, in units of 2**-50.
_MIX_SCALE = float(1 << 50)


def _check_sources(
    corpora: Sequence[object], generate: object, generated_weight: float | None, sampling: SamplingSettings
) -> float | None:
    """Usage errors of the count's sources (exit 2, nothing read yet); the mixing weight."""
    if not corpora and generate is None:
        raise DraftVocabUsageError("give ", Param("corpora"), ", ", Param("generate"), ", or both.")
    if generated_weight is not None and not (corpora and generate is not None):
        raise DraftVocabUsageError(
            Param("generated_weight"),
            " mixes ",
            Param("generate"),
            " with ",
            Param("corpora"),
            "; give both or drop it.",
        )
    if generated_weight is not None and not 0.0 < generated_weight < 1.0:
        raise DraftVocabUsageError(
            Param("generated_weight", generated_weight),
            " must lie strictly between 0 and 1 (the share of generated text in the counts).",
        )
    if sampling.max_new_tokens < 1:
        raise DraftVocabUsageError(Param("max_new_tokens", sampling.max_new_tokens), " must be at least 1.")
    if sampling.temperature < 0:
        raise DraftVocabUsageError(Param("temperature", sampling.temperature), " must be >= 0 (0 = greedy).")
    if not 0.0 < sampling.top_p <= 1.0:
        raise DraftVocabUsageError(Param("top_p", sampling.top_p), " must lie in (0, 1].")
    if generate is None:
        return None
    return (
        1.0 if not corpora else (DEFAULT_GENERATED_WEIGHT if generated_weight is None else generated_weight)
    )


def _mix(corpus: IntArray, generated: IntArray, weight: float) -> IntArray:
    """Counts in which ``generated`` makes up ``weight`` of the total and ``corpus`` the rest."""
    c_total, g_total = int(corpus.sum()), int(generated.sum())
    if not g_total:
        raise DraftVocabError("the model generated no tokens for the prompts; check the prompts file.")
    mixed = weight * _MIX_SCALE * generated / g_total + (1.0 - weight) * _MIX_SCALE * corpus / max(c_total, 1)
    out: IntArray = np.rint(mixed).astype(np.int64)
    return out


def _generated_record(
    prompts: PromptsFile,
    made: GeneratedCount,
    sampling: SamplingSettings,
    selected: tuple[IntArray, IntArray, list[int], list[CoveragePoint], int | None, IntArray],
    weight: float | None,
) -> GeneratedText:
    """How well the chosen ids (and those of each table size) cover the generated text."""
    counts, ids, forced, table, balance_tp, order = selected
    coverage, points = _held_out(counts, made.counts, table, ids, forced, balance_tp, order)
    return GeneratedText(
        prompts_file=prompts.path.name,
        prompts_sha256=prompts.sha256,
        prompts=made.prompts,
        tokens=made.tokens,
        distinct_ids=int(np.count_nonzero(made.counts)),
        max_new_tokens=sampling.max_new_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        coverage=coverage,
        coverage_table=points,
        weight=weight,
    )


def _check_request(
    info: TokenizerInfo,
    size: int,
    max_tokens: int | None,
    balance_tp: int | None,
    forced: list[int],
    out: Path,
) -> None:
    """Every refusal that needs no corpus, so none waits for a count."""
    if max_tokens is not None and max_tokens < 1:
        raise DraftVocabError(Param("max_tokens", max_tokens), " must be at least 1.")
    # A size out of range, too small for the forced ids or not split evenly by
    # balance_tp fails on an empty count.
    select_draft_ids(np.zeros(info.vocab_size, np.int64), size, forced=forced, balance_tp=balance_tp)
    if out.is_dir():
        raise DraftVocabError(Param("output", out), " is a directory; give a file name such as ids.pt.")


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


def _model_directory(spec: str, revision: str | None, tokenizer_dir: Path) -> Path:
    """The checkpoint vLLM loads: the local directory, or the whole Hub snapshot."""
    if Path(spec).expanduser().is_dir():
        return tokenizer_dir
    from mtpconv.checkpoint.source import resolve_source

    return resolve_source(spec, revision).directory


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
    generate: str | os.PathLike[str] | None = None,
    eval_prompts: str | os.PathLike[str] | None = None,
    sampling: SamplingSettings | None = None,
    generated_weight: float | None = None,
    engine_args: dict[str, Any] | None = None,
    generation_progress: ProgressCallback | None = None,
) -> DraftVocabReport:
    """Count ``corpora`` with the tokenizer of ``source`` (a directory or a Hub repo id,
    of which only configs and tokenizer files are fetched), keep the top ``size`` ids,
    write ``output`` (ids), its sidecar (and ``plot``), and return the report.

    ``generate`` (a prompts JSONL, :mod:`mtpconv.draft_vocab.prompts`) counts what the
    model generates for its prompts in vLLM (``sampling``; ``engine_args`` go to
    ``vllm.LLM``), alone or mixed with ``corpora`` at ``generated_weight`` (default
    0.5); ``eval_prompts`` reports coverage of what it generates for other prompts.
    Loading the model fetches the whole repo for a Hub id.
    """
    sampling = sampling or SamplingSettings()
    weight = _check_sources(corpora, generate, generated_weight, sampling)
    directory, described = resolve_tokenizer_source(os.fspath(source), revision)
    info = load_tokenizer_info(directory)
    forced = sorted(set(info.special_ids) | set(info.eos_ids))
    out = Path(output)
    _check_request(info, size, max_tokens, balance_tp, forced, out)
    plot_path = Path(plot) if plot is not None else None
    if plot_path is not None:
        require_matplotlib()
    chat = has_chat_template(directory)
    prompt_files = [
        read_prompts(p, chat_template=chat, model=os.fspath(source)) if p is not None else None
        for p in (generate, eval_prompts)
    ]
    files = discover_corpus_files(corpora) if corpora else []
    eval_files = discover_corpus_files(eval_corpora) if eval_corpora else []

    vocab_size = info.vocab_size
    made: list[GeneratedCount | None] = [None, None]
    gen_seconds = 0.0
    if any(prompt_files):
        model_dir = _model_directory(os.fspath(source), revision, directory)
        with target_engine(model_dir, seed=sampling.seed, engine_args=engine_args) as llm:
            for i, (pf, what) in enumerate(
                zip(prompt_files, ("Generating", "Generating held-out"), strict=True)
            ):
                if pf is not None:
                    made[i] = generate_counts(
                        llm, pf.prompts, sampling, vocab_size, progress=generation_progress, description=what
                    )
        gen_seconds = sum(m.seconds for m in made if m is not None)
    start = time.perf_counter()
    if files:
        corpus_counts, corpus = count_tokens(
            info.tokenizer, files, vocab_size, text_field=text_field, max_tokens=max_tokens, progress=progress
        )
    else:
        corpus_counts = np.zeros(vocab_size, np.int64)
        corpus = CorpusStats([], text_field, 0, 0, 0, max_tokens, False)
    seconds = time.perf_counter() - start
    generated = made[0]
    if generated is None:
        counts = corpus_counts
    elif not files:
        counts = generated.counts
    else:
        counts = _mix(corpus_counts, generated.counts, weight or DEFAULT_GENERATED_WEIGHT)
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
    selected = (counts, ids, forced, table, balance_tp, order)
    records = [
        _generated_record(pf, m, sampling, selected, w) if pf is not None and m is not None else None
        for pf, m, w in zip(prompt_files, made, (weight, None), strict=True)
    ]
    if eval_counts is None and made[1] is not None:
        eval_counts = made[1].counts  # the plot's held-out curve

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
        generated=records[0],
        eval_generated=records[1],
        plot=str(plot_path) if plot_path is not None else None,
        seconds=seconds,
        tokens_per_second=corpus.tokens / seconds if seconds > 0 else 0.0,
        generation_seconds=gen_seconds,
        generation_tokens_per_second=(
            sum(m.tokens for m in made if m is not None) / gen_seconds if gen_seconds > 0 else 0.0
        ),
        ids=[int(i) for i in ids],
    )
    write_text_durably(sidecar, dumps_json(report.sidecar_dict()))
    if plot_path is not None:
        plot_path.parent.mkdir(parents=True, exist_ok=True)
        write_plot(plot_path, counts, order, size, eval_counts)
    return report
