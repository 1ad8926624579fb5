"""The coverage curve of a draft vocabulary as a PNG (optional: needs matplotlib)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mtpconv.draft_vocab.counting import IntArray
from mtpconv.errors import DraftVocabError, Param
from mtpconv.jsonio import write_file_durably

_NEEDS_MATPLOTLIB = (Param("plot"), " needs matplotlib: pip install 'mtpconv[plot]'.")


def require_matplotlib() -> None:
    """Refuse a ``plot`` before any counting when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise DraftVocabError(*_NEEDS_MATPLOTLIB) from exc


def write_plot(
    path: Path, counts: IntArray, order: IntArray, size: int, eval_counts: IntArray | None
) -> None:
    """Cumulative coverage against top-k size (log x), held-out curve too; written atomically."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise DraftVocabError(*_NEEDS_MATPLOTLIB) from exc
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
