"""``mtpconv eval SRC VARIANT``: is the variant better in the vLLM installed here?

Serves each row (no speculation, the source's own drafter, the variant in stock vLLM,
the variant with mtpconv's plugin) in a fresh process, on the user's prompts or a
built-in set, greedily, at each batch size; compares every output with the
no-speculation run and reports acceptance, decode speed and the method and kernel
vLLM built for each drafter module. Everything the command line can get wrong is
refused (exit 2) before vLLM is loaded. The report is written into a local variant
directory as ``mtpconv-eval.json`` (``publish`` puts it in the model card).
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mtpconv.draft_vocab.generate import VLLM_HINT
from mtpconv.draft_vocab.prompts import PromptKind, has_chat_template, read_prompts
from mtpconv.errors import DraftVocabUsageError, EvalError, EvalUsageError
from mtpconv.evaluation.report import EvalReport, build_report, explain_stock_refusal
from mtpconv.evaluation.rows import ALL_ROWS, BUILTIN_PROMPTS, Row, RowJob
from mtpconv.evaluation.runner import run_rows
from mtpconv.jsonio import dumps_json, write_text_durably
from mtpconv.manifest import EVAL_REPORT_NAME, MANIFEST_NAME, read_manifest


def parse_batches(text: str) -> list[int]:
    """``"1,8"`` -> ``[1, 8]``: positive integers, each once, in the order given."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise EvalUsageError(f"batch sizes are positive integers separated by commas, not {text!r}.")
        if int(part) not in out:
            out.append(int(part))
    return out


def parse_rows(text: str | None) -> list[Row]:
    """``"no-spec,variant-plugin"`` -> those rows in report order; ``None`` -> every row."""
    if text is None:
        return list(ALL_ROWS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {r.value: r for r in ALL_ROWS}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise EvalUsageError(
            f"unknown row {', '.join(unknown) or repr(text)}; choose from {', '.join(known)}."
        )
    return [r for r in ALL_ROWS if r.value in names]


def parse_engine_args(items: Sequence[str]) -> dict[str, Any]:
    """``["max_model_len=4096", "enforce_eager=true"]`` -> keyword arguments of vLLM's ``LLM``.

    A value is read as JSON where it parses (numbers, booleans, objects), else as a string.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise EvalUsageError(f"an engine argument is KEY=VALUE (e.g. max_model_len=4096), not {item!r}.")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    if "speculative_config" in out or "model" in out:
        raise EvalUsageError("the rows set model and speculative_config themselves; leave them out.")
    return out


def _local(path: str) -> Path | None:
    p = Path(path).expanduser()
    return p if p.exists() else None


def _check_model(name: str, what: str) -> Path | None:
    """A local directory, or ``None`` for a Hub repo id vLLM will resolve; refuse anything else."""
    local = _local(name)
    if local is not None and not local.is_dir():
        raise EvalUsageError(f"{what} {name} is a file; give the checkpoint's directory.")
    if local is None and (name.startswith((".", "/", "~")) or name.count("/") != 1):
        raise EvalUsageError(f"{what} {name} does not exist (and is not a Hub repo id).")
    return local


def require_vllm() -> None:
    """vLLM must be importable where the rows will run (this Python)."""
    if importlib.util.find_spec("vllm") is None:
        raise EvalError(f"mtpconv eval serves the models in vLLM, which is not installed: {VLLM_HINT}.")


def evaluate(
    source: str,
    variant: str,
    *,
    prompts_file: Path | None = None,
    num_speculative_tokens: int = 3,
    batches: Sequence[int] = (1, 8),
    max_tokens: int = 128,
    rows: Sequence[Row] = ALL_ROWS,
    engine_args: dict[str, Any] | None = None,
    save: bool = True,
    command: str = "mtpconv eval",
    notify: Callable[[str], None] | None = None,
) -> EvalReport:
    """Serve ``rows`` and compare them; see the module docstring."""
    source_dir = _check_model(source, "SRC")
    variant_dir = _check_model(variant, "VARIANT")
    if variant_dir is not None and not (variant_dir / MANIFEST_NAME).is_file():
        raise EvalError(
            f"{variant} has no {MANIFEST_NAME}: it is not a variant; write one with "
            "`mtpconv quantize-mtp SRC DST`."
        )
    if prompts_file is not None:
        chat_ok = source_dir is None or has_chat_template(source_dir)
        try:
            checked = read_prompts(prompts_file, chat_template=chat_ok, model=source)
        except DraftVocabUsageError as exc:
            raise EvalUsageError(str(exc)) from exc
        prompts = [
            {"prompt": p.value} if p.kind is PromptKind.TEXT else {"messages": p.value}
            for p in checked.prompts
        ]
    else:
        prompts = [{"prompt": text} for text in BUILTIN_PROMPTS]
    manifest = read_manifest(variant_dir) if variant_dir is not None else None  # a broken one: before any row
    require_vllm()
    jobs = [
        RowJob(
            row=row,
            model=str(variant_dir or variant) if row.serves_variant else str(source_dir or source),
            prompts=prompts,
            batches=list(batches),
            max_tokens=max_tokens,
            num_speculative_tokens=num_speculative_tokens,
            engine_args=dict(engine_args or {}),
        )
        for row in rows
    ]
    workdir = Path(tempfile.mkdtemp(prefix="mtpconv-eval-"))
    if notify:
        notify(f"each row runs in a fresh vLLM process; logs in {workdir}")
    outcomes = run_rows(jobs, workdir, notify=notify)
    report = build_report(
        outcomes,
        source=source,
        variant=variant,
        num_speculative_tokens=num_speculative_tokens,
        max_tokens=max_tokens,
        prompts=str(prompts_file) if prompts_file is not None else "built-in",
        command=command,
    )
    if manifest is not None and manifest.drafter.declaration == "standard":
        explain_stock_refusal(report, manifest.drafter.declared_algorithms.values())
    if save and variant_dir is not None and report.ok:
        write_text_durably(variant_dir / EVAL_REPORT_NAME, dumps_json(report.to_dict()))
        if notify:
            notify(f"report written to {variant_dir / EVAL_REPORT_NAME}")
    return report
