"""Frequency-ranked draft vocabularies: count, select top-K, report coverage, save.

``build_draft_vocab`` counts how often each token id occurs when the checkpoint's
own ``tokenizer.json`` encodes a corpus (no BOS/EOS templates are added; special
tokens written literally in the text are counted), picks the K most frequent ids
(ties: lower id first), always including every added/special token and every EOS
id, and writes:

- ``IDS.pt``: a 1-D int64 tensor of the ids, sorted ascending, via ``torch.save``
  (read it back with :func:`load_draft_vocab_ids`, which never unpickles code);
- ``IDS.pt.json`` (the sidecar, :func:`sidecar_path`): what was selected and how
  well it covers the corpus, with the corpus and tokenizer identified by sha256.

With ``balance_tp=N`` the vocabulary ``[0, V)`` (V = ``vocab_size`` of config.json)
is cut into N contiguous shards ``[i*ceil(V/N), min((i+1)*ceil(V/N), V))`` and each
shard gets exactly K/N ids, so rank i of a tensor-parallel draft head holds rows
whose ids all lie in its own shard of the full head. vLLM pads the vocabulary to a
multiple of 64 before splitting it; when V is a multiple of 64*N (as for the Qwen
family) the two rules give the same shards.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from mtpconv import __version__
from mtpconv.checkpoint.digests import sha256_file
from mtpconv.corpus import CorpusFile, TextBatch, discover_corpus_files, iter_text_batches
from mtpconv.errors import DraftVocabError
from mtpconv.jsonio import read_json, write_file_durably, write_text_durably

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from mtpconv.console import ProgressCallback

SIDECAR_FORMAT_VERSION = 1
DEFAULT_COVERAGE_SIZES: tuple[int, ...] = (8192, 16384, 32768, 65536)
IntArray = npt.NDArray[np.int64]


# ---------------------------------------------------------------------------
# Records


@dataclass
class CorpusFileStats:
    path: str
    format: str
    sha256: str
    bytes: int
    texts: int
    tokens: int
    complete: bool  # False when --max-tokens stopped inside this file


@dataclass
class CorpusStats:
    files: list[CorpusFileStats]
    text_field: str
    texts: int
    tokens: int
    distinct_ids: int
    max_tokens: int | None = None
    truncated: bool = False  # stopped by max_tokens before the end of the corpus


@dataclass
class CoveragePoint:
    size: int
    coverage: float


@dataclass
class EvalCoverage:
    corpus: CorpusStats
    coverage: float
    coverage_table: list[CoveragePoint]


@dataclass
class DraftVocabReport:
    """What ``build_draft_vocab`` selected and wrote; ``to_dict()`` for ``--json``."""

    output: str
    sidecar: str
    size: int
    vocab_size: int
    coverage: float
    coverage_table: list[CoveragePoint]
    corpus: CorpusStats
    tokenizer: dict[str, str]
    special_ids: list[int]
    eos_ids: list[int]
    source: dict[str, str | None]
    ids_sha256: str
    balance_tp: int | None = None
    eval: EvalCoverage | None = None
    plot: str | None = None
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    ids: list[int] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.pop("ids")
        return doc

    def sidecar_dict(self) -> dict[str, Any]:
        """The JSON sidecar: this report without paths of this run and timing."""
        doc = self.to_dict()
        for key in ("output", "sidecar", "plot", "seconds", "tokens_per_second"):
            doc.pop(key)
        return {
            "format_version": SIDECAR_FORMAT_VERSION,
            "tool": {"name": "mtpconv", "version": __version__},
            "ids_file": Path(self.output).name,
            **doc,
        }


# ---------------------------------------------------------------------------
# Tokenizer and model vocabulary


@dataclass
class TokenizerInfo:
    tokenizer: Tokenizer
    path: Path
    sha256: str
    vocab_size: int  # rows of the model's head (config.json), not the tokenizer's size
    special_ids: list[int]
    eos_ids: list[int]


def _id_list(value: Any, where: str) -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise DraftVocabError(f"{where}: eos_token_id {value!r} is not an integer or a list of them.")
    return [int(v) for v in values]


def load_tokenizer_info(source_dir: str | os.PathLike[str]) -> TokenizerInfo:
    """The checkpoint's tokenizer, head size, special/added ids and EOS ids."""
    from tokenizers import Tokenizer

    source = Path(source_dir)
    config_path = source / "config.json"
    if not config_path.is_file():
        raise DraftVocabError(f"{source} has no config.json; point SRC at a model checkpoint.")
    config = read_json(config_path, DraftVocabError, require_object=False)
    text_config = config.get("text_config") if isinstance(config, dict) else None
    text_config = text_config if isinstance(text_config, dict) else {}
    vocab_size = config.get("vocab_size") if isinstance(config, dict) else None
    if vocab_size is None:
        vocab_size = text_config.get("vocab_size")
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise DraftVocabError(
            f"{config_path} has no positive integer vocab_size (nor text_config.vocab_size)."
        )

    tok_path = source / "tokenizer.json"
    if not tok_path.is_file():
        raise DraftVocabError(
            f"{source} has no tokenizer.json; build-draft-vocab counts with the checkpoint's "
            "own fast tokenizer. Copy tokenizer.json from the base model into the checkpoint."
        )
    try:
        tokenizer = Tokenizer.from_file(str(tok_path))
    except Exception as exc:  # the Rust side raises plain Exception on a bad file
        raise DraftVocabError(f"{tok_path} is not a valid tokenizers file ({exc}).") from exc
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    if not vocab:
        raise DraftVocabError(f"{tok_path} has an empty vocabulary.")
    max_id = max(vocab.values())
    if max_id >= vocab_size:
        raise DraftVocabError(
            f"{tok_path} has token id {max_id}, but config.json says vocab_size {vocab_size}; "
            "the tokenizer does not belong to this checkpoint."
        )
    special_ids = sorted(tokenizer.get_added_tokens_decoder())

    eos: set[int] = set()
    eos.update(_id_list(config.get("eos_token_id"), str(config_path)))
    eos.update(_id_list(text_config.get("eos_token_id"), str(config_path)))
    gen_path = source / "generation_config.json"
    if gen_path.is_file():
        gen = read_json(gen_path, DraftVocabError, require_object=False)
        if isinstance(gen, dict):
            eos.update(_id_list(gen.get("eos_token_id"), str(gen_path)))
    bad = sorted(i for i in eos if not 0 <= i < vocab_size)
    if bad:
        raise DraftVocabError(f"EOS id {bad[0]} in {source} is outside the vocabulary [0, {vocab_size}).")
    return TokenizerInfo(tokenizer, tok_path, sha256_file(tok_path), vocab_size,
                         special_ids, sorted(eos))  # fmt: skip


TOKENIZER_SOURCE_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                          "tokenizer_config.json")  # fmt: skip


def resolve_tokenizer_source(spec: str, revision: str | None = None) -> tuple[Path, dict[str, str | None]]:
    """A local checkpoint directory, or the tokenizer and config files of a Hub repo.

    Only :data:`TOKENIZER_SOURCE_FILES` are fetched for a repo id (through the HF
    cache, so ``HF_HOME`` / ``HF_TOKEN`` / ``HF_HUB_OFFLINE`` apply), never weights.
    Returns the directory and a ``{"repo_id", "revision", "path"}`` description.
    """
    from mtpconv.checkpoint.source import resolve_source

    source = resolve_source(spec, revision, allow_patterns=TOKENIZER_SOURCE_FILES)
    return source.directory, source.describe()


# ---------------------------------------------------------------------------
# Counting


def _encoder(tokenizer: Tokenizer) -> Callable[[list[str]], list[Any]]:
    # encode_batch_fast (tokenizers >= 0.21) skips offsets, which we never read.
    fast = getattr(tokenizer, "encode_batch_fast", None)
    batch = fast if fast is not None else tokenizer.encode_batch

    def encode(texts: list[str]) -> list[Any]:
        return list(batch(texts, add_special_tokens=False))

    return encode


def _file_batches(files: Sequence[CorpusFile], text_field: str) -> Iterator[tuple[int, TextBatch | None]]:
    """(file index, batch) over all files; (index, None) marks the end of a file."""
    for i, cf in enumerate(files):
        for batch in iter_text_batches(cf, text_field=text_field):
            yield i, batch
        yield i, None


def _pipelined(
    items: Iterator[tuple[int, TextBatch | None]], encode: Callable[[list[str]], list[Any]]
) -> Generator[tuple[int, TextBatch | None, list[Any] | None], None, None]:
    """Encode batch n+1 on a worker thread while the caller counts batch n.

    The tokenizer releases the GIL while it encodes, so reading, parsing and
    counting overlap with encoding; at most two batches are alive at a time.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending: list[tuple[int, TextBatch | None, Future[list[Any]] | None]] = []
        try:
            for i, batch in items:
                future = pool.submit(encode, batch.texts) if batch is not None else None
                if future is not None:
                    for j, b, f in pending:
                        yield j, b, f.result() if f is not None else None
                    pending = []
                pending.append((i, batch, future))
            for j, b, f in pending:
                yield j, b, f.result() if f is not None else None
        finally:
            for _, _, f in pending:
                if f is not None:
                    f.cancel()


def count_tokens(
    tokenizer: Tokenizer,
    files: Sequence[CorpusFile],
    vocab_size: int,
    *,
    text_field: str = "text",
    max_tokens: int | None = None,
    progress: ProgressCallback | None = None,
    description: str = "Counting tokens",
) -> tuple[IntArray, CorpusStats]:
    """Count token ids over ``files`` (streamed); ``counts[i]`` = occurrences of id i.

    Stops after exactly ``max_tokens`` tokens when given (the last text may be cut);
    files not reached by then are not listed in the returned stats.
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    stats: list[CorpusFileStats] = []
    texts = [0] * len(files)
    tokens = [0] * len(files)
    done = [0] * len(files)
    total = 0
    truncated = False
    if progress is not None:
        progress.start(description, sum(cf.size for cf in files))

    def finish(i: int, complete: bool) -> None:
        cf = files[i]
        if complete and tokens[i] == 0:
            raise DraftVocabError(
                f"corpus file {cf.path} contains no text (0 tokens); remove it or check --text-field."
            )
        stats.append(CorpusFileStats(str(cf.path), cf.kind, sha256_file(cf.path), cf.size,
                                     texts[i], tokens[i], complete))  # fmt: skip
        if progress is not None and complete:
            progress.advance(cf.size - done[i])

    stream = _pipelined(_file_batches(files, text_field), _encoder(tokenizer))
    for i, batch, encodings in stream:
        if batch is None or encodings is None:
            finish(i, complete=True)
            continue
        if max_tokens is not None and total >= max_tokens:
            truncated = True
            if tokens[i]:
                finish(i, complete=False)
            break
        ids = np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in encodings])
        n_texts = len(batch.texts)
        cut = max_tokens is not None and total + ids.size > max_tokens
        if max_tokens is not None and cut:
            keep = max_tokens - total
            lengths = np.cumsum([len(e.ids) for e in encodings])
            n_texts = int(np.searchsorted(lengths, keep, side="left")) + 1
            ids = ids[:keep]
        binned = np.bincount(ids, minlength=vocab_size)
        if binned.size > vocab_size:  # load_tokenizer_info rules this out; never silent
            raise DraftVocabError(f"the tokenizer produced id {binned.size - 1} >= vocab_size {vocab_size}.")
        counts += binned
        total += ids.size
        tokens[i] += ids.size
        texts[i] += n_texts
        if progress is not None:
            progress.advance(batch.position - done[i])
        done[i] = batch.position
        if cut:
            truncated = True
            finish(i, complete=False)
            break
    stream.close()
    corpus = CorpusStats(stats, text_field, sum(s.texts for s in stats), total,
                         int(np.count_nonzero(counts)), max_tokens, truncated)  # fmt: skip
    return counts, corpus


# ---------------------------------------------------------------------------
# Selection and coverage


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
        raise DraftVocabError(f"draft vocabulary size {size} must be in [1, {vocab_size}].")
    forced_ids = np.unique(np.asarray(list(forced), dtype=np.int64))
    if forced_ids.size and (forced_ids[0] < 0 or forced_ids[-1] >= vocab_size):
        raise DraftVocabError(f"forced ids must lie in [0, {vocab_size}).")
    if order is None:
        order = rank_ids(counts)
    free = order[~np.isin(order, forced_ids)]
    if not balance_tp:
        if forced_ids.size > size:
            raise DraftVocabError(
                f"the tokenizer has {forced_ids.size} special/added and EOS tokens, which "
                f"must all be kept; --size {size} is too small for them."
            )
        chosen = np.concatenate([forced_ids, free[: size - forced_ids.size]])
        return np.sort(chosen)
    if balance_tp < 1 or size % balance_tp:
        raise DraftVocabError(
            f"--size {size} is not divisible by --balance-tp {balance_tp}; pick K = a "
            f"multiple of {balance_tp}."
        )
    quota = size // balance_tp
    shard = math.ceil(vocab_size / balance_tp)
    parts = []
    for i in range(balance_tp):
        lo, hi = i * shard, min((i + 1) * shard, vocab_size)
        in_shard = forced_ids[(forced_ids >= lo) & (forced_ids < hi)]
        if hi - lo < quota or in_shard.size > quota:
            reason = (f"has only {max(hi - lo, 0)} ids" if hi - lo < quota
                      else f"holds {in_shard.size} special/EOS ids")  # fmt: skip
            raise DraftVocabError(
                f"with --balance-tp {balance_tp}, vocabulary shard {i} [{lo}, {hi}) {reason} "
                f"but must get {quota} of the {size}; choose another --size or --balance-tp."
            )
        rest = free[(free >= lo) & (free < hi)]
        parts += [in_shard, rest[: quota - in_shard.size]]
    return np.sort(np.concatenate(parts))


def coverage_of(counts: IntArray, ids: IntArray) -> float:
    """Share of counted tokens whose id is in ``ids`` (0.0 for an empty count)."""
    total = int(counts.sum())
    return int(counts[ids].sum()) / total if total else 0.0


def coverage_sizes(size: int, vocab_size: int, sizes: Sequence[int],
                   balance_tp: int | None) -> list[int]:  # fmt: skip
    """Table sizes: ``sizes`` that fit the vocabulary (and the TP split), plus ``size``."""
    keep = {s for s in sizes if 1 <= s <= vocab_size and (not balance_tp or s % balance_tp == 0)}
    return sorted(keep | {size})


def _coverage_table(counts: IntArray, sizes: list[int], forced: list[int],
                    balance_tp: int | None, order: IntArray) -> list[CoveragePoint]:  # fmt: skip
    table = []
    for s in sizes:
        try:
            ids = select_draft_ids(counts, s, forced=forced, balance_tp=balance_tp, order=order)
        except DraftVocabError:
            continue  # this size cannot hold the forced ids; the chosen size was checked
        table.append(CoveragePoint(s, coverage_of(counts, ids)))
    return table


# ---------------------------------------------------------------------------
# Files


def sidecar_path(ids_path: str | os.PathLike[str]) -> Path:
    """The JSON sidecar next to an ids file: ``IDS.pt`` -> ``IDS.pt.json``."""
    path = Path(ids_path)
    return path.with_name(path.name + ".json")


def save_draft_vocab_ids(ids: IntArray | torch.Tensor, path: str | os.PathLike[str]) -> Path:
    """Write ids as a 1-D int64 tensor sorted ascending (``torch.save``), atomically."""
    tensor = torch.as_tensor(ids, dtype=torch.int64).reshape(-1).sort().values.contiguous()
    out = Path(path)
    write_file_durably(out, lambda tmp: torch.save(tensor, tmp))
    return out


def load_draft_vocab_ids(path: str | os.PathLike[str], vocab_size: int) -> torch.Tensor:
    """Load and validate a draft-vocabulary ids file; never executes pickled code.

    Accepts only a non-empty 1-D int64 tensor, strictly ascending (so no
    duplicates), with every id in ``[0, vocab_size)``.
    """
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


def _write_plot(path: Path, counts: IntArray, order: IntArray, size: int,
                eval_counts: IntArray | None) -> None:  # fmt: skip
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise DraftVocabError("--plot needs matplotlib: pip install 'mtpconv[plot]'.") from exc
    ks = np.unique(np.geomspace(1, counts.size, num=min(2000, counts.size)).astype(np.int64))
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    curves = [("corpus", counts)] + ([("held-out", eval_counts)] if eval_counts is not None else [])
    for label, c in curves:
        total = max(int(c.sum()), 1)
        cum = np.cumsum(c[order]) / total
        ax.plot(ks, cum[ks - 1], label=label)
    ax.axvline(size, color="grey", linestyle="--", label=f"K = {size}")
    ax.set_xscale("log")
    ax.set_xlabel("draft vocabulary size (top-k ids by corpus frequency)")
    ax.set_ylabel("share of tokens covered")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    write_file_durably(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


# ---------------------------------------------------------------------------
# Orchestration


def build_draft_vocab(
    source_dir: str | os.PathLike[str],
    corpora: Sequence[str | os.PathLike[str]],
    size: int,
    output: str | os.PathLike[str],
    *,
    text_field: str = "text",
    max_tokens: int | None = None,
    eval_corpora: Sequence[str | os.PathLike[str]] = (),
    balance_tp: int | None = None,
    plot: str | os.PathLike[str] | None = None,
    progress: ProgressCallback | None = None,
    coverage_table_sizes: Sequence[int] = DEFAULT_COVERAGE_SIZES,
    source_description: dict[str, str | None] | None = None,
) -> DraftVocabReport:
    """Count ``corpora`` with the checkpoint's tokenizer, keep the top ``size`` ids, write
    ``output`` (ids) and its sidecar (and ``plot``), and return the report.

    Everything is validated before counting starts; files appear atomically.
    ``source_description`` (``{"repo_id", "revision", "path"}``) is recorded in the
    sidecar; by default the resolved ``source_dir``.
    """
    info = load_tokenizer_info(source_dir)
    vocab_size = info.vocab_size
    if not 1 <= size <= vocab_size:
        raise DraftVocabError(f"--size {size} must be between 1 and vocab_size {vocab_size}.")
    if max_tokens is not None and max_tokens < 1:
        raise DraftVocabError(f"--max-tokens {max_tokens} must be at least 1.")
    if balance_tp is not None and (balance_tp < 1 or size % balance_tp):
        raise DraftVocabError(
            f"--size {size} is not divisible by --balance-tp {balance_tp}; pick a multiple of {balance_tp}."
        )
    forced = sorted(set(info.special_ids) | set(info.eos_ids))
    # Fail on a too-small K or an impossible TP split before reading any corpus.
    select_draft_ids(np.zeros(vocab_size, np.int64), size, forced=forced, balance_tp=balance_tp)
    out = Path(output)
    if out.is_dir():
        raise DraftVocabError(f"--output {out} is a directory; give a file name such as ids.pt.")
    plot_path = Path(plot) if plot is not None else None
    if plot_path is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise DraftVocabError("--plot needs matplotlib: pip install 'mtpconv[plot]'.") from exc
    files = discover_corpus_files(corpora)
    eval_files = discover_corpus_files(eval_corpora) if eval_corpora else []

    start = time.perf_counter()
    counts, corpus = count_tokens(info.tokenizer, files, vocab_size, text_field=text_field,
                                  max_tokens=max_tokens, progress=progress)  # fmt: skip
    counted_at = time.perf_counter()
    order = rank_ids(counts)
    ids = select_draft_ids(counts, size, forced=forced, balance_tp=balance_tp, order=order)
    sizes = coverage_sizes(size, vocab_size, coverage_table_sizes, balance_tp)
    table = _coverage_table(counts, sizes, forced, balance_tp, order)

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
        eval_table = []
        for point in table:
            chosen = select_draft_ids(counts, point.size, forced=forced, balance_tp=balance_tp,
                                      order=order)  # fmt: skip
            eval_table.append(CoveragePoint(point.size, coverage_of(eval_counts, chosen)))
        eval_report = EvalCoverage(eval_corpus, coverage_of(eval_counts, ids), eval_table)

    out.parent.mkdir(parents=True, exist_ok=True)
    save_draft_vocab_ids(ids, out)
    sidecar = sidecar_path(out)
    seconds = counted_at - start
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
        source=source_description
        or {"repo_id": None, "revision": None, "path": str(Path(source_dir).resolve())},
        ids_sha256=sha256_file(out),
        balance_tp=balance_tp,
        eval=eval_report,
        plot=str(plot_path) if plot_path is not None else None,
        seconds=seconds,
        tokens_per_second=corpus.tokens / seconds if seconds > 0 else 0.0,
        ids=[int(i) for i in ids],
    )
    text = json.dumps(report.sidecar_dict(), indent=2) + "\n"
    write_text_durably(sidecar, text)
    if plot_path is not None:
        plot_path.parent.mkdir(parents=True, exist_ok=True)
        _write_plot(plot_path, counts, order, size, eval_counts)
    return report
