"""Every table, summary line and ``--json`` document the commands print.

Data (tables, JSON, the files written, URLs) goes to stdout; notices go to stderr
through :mod:`mtpconv.console`. Only the report record types are imported, and only
for type checking, so this module does not pull the command modules (torch,
huggingface_hub) into CLI start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from mtpconv import console
from mtpconv.console import out_console
from mtpconv.findings import Severity
from mtpconv.names import fold_expert_index
from mtpconv.units import human_bytes

if TYPE_CHECKING:
    from mtpconv.commands.fix_exclusions import FixReport
    from mtpconv.commands.inspect import InspectReport, TensorRow
    from mtpconv.commands.publish import PublishPlan, PublishResult
    from mtpconv.commands.quantize_mtp import ConversionReport
    from mtpconv.commands.set_draft_window import DraftWindowReport
    from mtpconv.commands.verify import VerifyReport
    from mtpconv.draft_vocab.report import DraftVocabReport
    from mtpconv.evaluation.report import EvalReport
    from mtpconv.quantconfig.stock_view import StockView

_Report = TypeVar(
    "_Report",
    bound="InspectReport | ConversionReport | FixReport | DraftVocabReport | DraftWindowReport"
    " | VerifyReport | EvalReport | PublishPlan | PublishResult",
)

_SEVERITY_STYLE = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def render_json(
    report: InspectReport
    | ConversionReport
    | FixReport
    | DraftVocabReport
    | DraftWindowReport
    | VerifyReport
    | EvalReport
    | PublishPlan
    | PublishResult,
) -> None:
    """A report as one JSON document on stdout (``--json``)."""
    console.emit_json(report.to_dict())


def show(report: _Report, human: Callable[[_Report], None], *, as_json: bool) -> None:
    """``report`` as the command's ``--json`` switch asks: one JSON document, or ``human``."""
    if as_json:
        render_json(report)
    else:
        human(report)


def render_inspect(r: InspectReport) -> None:
    """The summary, drafter tensors, draft-step cost and findings of ``inspect``."""
    c = out_console
    summary = Table(show_header=False, box=None, title=f"[bold]{r.source}[/bold]", title_justify="left")
    summary.add_row("family", r.family)
    summary.add_row("model_type", r.model_type)
    algo = f"{r.quant_method}" + (f" / {r.quant_algo}" if r.quant_algo else "")
    summary.add_row("quantization", algo)
    if r.exclude_modules:
        summary.add_row("excluded", ", ".join(r.exclude_modules))
    if r.kv_cache_algo:
        summary.add_row("kv cache", r.kv_cache_algo)
    declared = r.mtp_layers_declared if r.mtp_layers_declared is not None else "-"
    summary.add_row("MTP layers", f"{r.mtp_layers_found} found / {declared} declared")
    summary.add_row("weights", f"{human_bytes(r.total_bytes)} in {r.shards} shard(s)")
    if r.variant:
        summary.add_row(
            "variant",
            f"mtpconv {r.variant['tool'].get('version', '?')}, "
            f"{r.variant['fp8_linears']} FP8 drafter linears",
        )
        window = r.variant.get("draft_window")
        summary.add_row("draft attention", "full" if window is None else f"sliding window of {window} tokens")
    dv = r.draft_vocab
    summary.add_row(
        "draft vocab",
        "none" if dv is None else f"{dv['file']} ({dv['size'] or '?'} ids, head {dv['head_dtype'] or '?'})",
    )
    c.print(summary)

    if r.drafter:
        t = Table(title="Drafter tensors", title_justify="left")
        for col in ("tensor", "dtype", "shape", "stored", "role", "declared"):
            t.add_column(col)
        t.add_column("n", justify="right")
        for name, row, count in _expert_groups(r.drafter):
            shown = row.declared or ("unquantized" if row.role in ("linear", "head") else "")
            shape = "x".join(map(str, row.shape)) or "scalar"
            t.add_row(name, row.dtype, shape, row.format, row.role, shown, str(count))
        c.print(t)

    if r.cost is not None:
        k = r.cost
        t = Table(title="Drafter bytes read per draft step (1 token)", title_justify="left")
        for col in ("", "stack", "head", "total"):
            t.add_column(col, justify="right")
        t.add_row("now", human_bytes(k.stack_now), human_bytes(k.head_now), human_bytes(k.total_now))
        t.add_row("FP8 drafter", human_bytes(k.stack_fp8), human_bytes(k.head_now), human_bytes(k.total_fp8))
        t.add_row(
            f"FP8 + {k.draft_vocab_size}-row FP8 head",
            human_bytes(k.stack_fp8),
            human_bytes(k.head_fp8_truncated),
            human_bytes(k.total_fp8_truncated),
        )
        c.print(t)

    if r.stock_vllm is not None:
        _render_stock_view(r.stock_vllm)

    if r.findings:
        t = Table(title="Findings", title_justify="left")
        for col in ("severity", "module", "finding"):
            t.add_column(col)
        for f in r.findings:
            style = _SEVERITY_STYLE[f.severity]
            t.add_row(f"[{style}]{f.severity.value}[/{style}]", f.module, f.message)
        c.print(t)
    else:
        c.print("[green]No findings: the quant config matches the stored tensors.[/green]")


def _expert_groups(rows: list[TensorRow]) -> list[tuple[str, TensorRow, int]]:
    """The drafter's tensors with routed experts folded: one ``experts.*`` row per tensor
    kind that every expert stores alike, with how many there are (a 512-expert drafter is
    a few rows, not 1,500; ``--json`` lists each tensor)."""
    groups: dict[tuple[object, ...], list[Any]] = {}
    for row in rows:
        name = fold_expert_index(row.name)
        key = (name, row.dtype, row.shape, row.format, row.role, row.declared)
        if key in groups:
            groups[key][2] += 1
        else:
            groups[key] = [name, row, 1]
    return [(name, row, count) for name, row, count in groups.values()]


def _render_stock_view(v: StockView) -> None:
    """One row per (kind, what vLLM gets, why): the per-module list is in ``--json``."""
    whose = "what quantize-mtp would declare" if v.of.value == "source" else "what its configs declare"
    t = Table(title=f"How stock vLLM reads the drafter ({whose})", title_justify="left", caption=v.reason)
    for col in ("modules", "kind", "stock vLLM gets", "why"):
        t.add_column(col)
    groups: dict[tuple[str, str, str], list[tuple[str, int]]] = {}
    for row in v.rows:
        groups.setdefault((row.kind.value, row.gets, row.why), []).append((row.module, row.count))
    for (kind, gets, why), members in groups.items():
        total = sum(n for _, n in members)
        first = members[0][0]
        shown = first if total == 1 else f"{total} modules: {first}" + (", ..." if len(members) > 1 else "")
        t.add_row(escape(shown), kind, gets, escape(why))
    out_console.print(t)


def render_conversion(r: ConversionReport) -> None:
    """What ``quantize-mtp`` planned (``--dry-run``) or wrote."""
    p = r.plan
    title = "Plan (dry run, nothing written)" if r.dry_run else f"Wrote {r.destination}"
    t = Table(show_header=False, box=None, title=f"[bold]{title}[/bold]", title_justify="left")
    t.add_row("family", p.layout.family)
    t.add_row("FP8 drafter linears", str(len(p.linears)))
    if p.dropped:
        t.add_row("NVFP4 scales dropped", str(len(p.dropped)))
    t.add_row("shards rewritten", ", ".join(s.file for s in p.rewritten) or "-")
    t.add_row("shards linked", str(len(p.linked)))
    if p.draft_head is not None:
        h = p.draft_head
        t.add_row("draft head", f"{h.tensor} [{h.rows} x {h.hidden}] {h.dtype}")
    if r.draft_window is not None:
        t.add_row("draft attention window", f"{r.draft_window} tokens")
    saved = human_bytes(p.bytes_before - p.bytes_after)
    t.add_row("weights", f"{human_bytes(p.bytes_before)} -> {human_bytes(p.bytes_after)} (saved {saved})")
    if not r.dry_run:
        t.add_row("max relative L2 error", f"{r.max_rel_l2:.4%}")
        t.add_row("files linked / copied", f"{r.linked} / {r.copied}")
        t.add_row("device / time", f"{r.device} / {r.seconds:.1f} s")
    out_console.print(t)


def render_draft_window(r: DraftWindowReport) -> None:
    """What ``set-draft-window`` recorded in the manifest."""
    before = "full" if r.previous is None else f"{r.previous} tokens"
    after = "full" if r.window is None else f"{r.window} tokens"
    change = f"{after} (unchanged)" if r.previous == r.window else f"{before} -> {after}"
    _echo(f"{r.manifest}: draft attention {change}")


def render_fix(r: FixReport) -> None:
    """What ``fix-exclusions`` excluded (or would), and the backups it kept."""
    c = out_console
    if not r.excluded:
        c.print("Nothing to fix: every module stored unquantized is already excluded.")
        return
    verb = "Would exclude" if r.dry_run else "Excluded"
    c.print(f"{verb} in {r.destination}: " + ", ".join(r.excluded))
    for edit in r.edits:
        c.print(f"  {edit.document} {edit.key}: + " + ", ".join(edit.added))
    for b in r.backups:
        c.print(f"backup: {b}")


def render_draft_vocab(r: DraftVocabReport) -> None:
    """The counting summary (stderr), the coverage table and the files written (stdout)."""
    g, eg = r.generated, r.eval_generated
    if g is not None or eg is not None:
        made = sum(x.tokens for x in (g, eg) if x is not None)
        asked = sum(x.prompts for x in (g, eg) if x is not None)
        console.info(
            f"Generated {made:,} tokens for {asked:,} prompt(s) in {r.generation_seconds:.1f} s "
            f"({r.generation_tokens_per_second:,.0f} tokens/s)."
        )
    if r.corpus.files:
        stopped = " (stopped at --max-tokens)" if r.corpus.truncated else ""
        console.info(
            f"Counted {r.corpus.tokens:,} tokens in {len(r.corpus.files)} file(s) in "
            f"{r.seconds:.1f} s ({r.tokens_per_second:,.0f} tokens/s){stopped}."
        )
    # What the ranking counted: the corpus, the generated text, or both mixed.
    counted = "corpus" if g is None else ("generated" if not r.corpus.files else "mixed")
    tokens = r.corpus.tokens + (g.tokens if g is not None else 0)
    extra: list[tuple[str, dict[int, float]]] = []
    if g is not None and r.corpus.files:
        extra.append((f"generated (weight {g.weight})", {p.size: p.coverage for p in g.coverage_table}))
    if r.eval:
        held = {p.size: p.coverage for p in r.eval.coverage_table}
        extra.append((f"held-out ({r.eval.corpus.tokens:,} tokens)", held))
    if eg is not None:
        held = {p.size: p.coverage for p in eg.coverage_table}
        extra.append((f"held-out generated ({eg.tokens:,} tokens)", held))
    table = Table(title=f"Coverage of {tokens:,} {counted} tokens", title_justify="left")
    table.add_column("draft vocab size", justify="right")
    table.add_column(counted, justify="right")
    for header, _ in extra:
        table.add_column(header, justify="right")
    for p in r.coverage_table:
        row = [f"{p.size:,}" + (" (K)" if p.size == r.size else ""), f"{p.coverage:.2%}"]
        table.add_row(*row, *[f"{col[p.size]:.2%}" for _, col in extra])
    out_console.print(table)
    plotted = f"; plot {r.plot}" if r.plot else ""
    _echo(
        f"Wrote {r.output} ({r.size:,} of {r.vocab_size:,} ids, coverage "
        f"{r.coverage:.2%}) and {r.sidecar}{plotted}."
    )


def render_publish_plan(plan: PublishPlan) -> None:
    """The ``publish --dry-run`` listing: every file, its size, and the generated card."""
    where = plan.repo_id + (f" @ {plan.revision}" if plan.revision else "")
    where += " as a pull request" if plan.create_pr else ""
    _echo(f"Would upload {len(plan.items)} files ({human_bytes(plan.total_bytes)}) to {where}:")
    for item in plan.items:
        note = "  (generated)" if item.local is None else ""
        _echo(f"  {human_bytes(item.size):>12}  {item.path_in_repo}{note}")
    if plan.card is not None:
        _echo("\n--- README.md (generated) ---\n" + plan.card.rstrip())


def render_publish_result(result: PublishResult) -> None:
    """A notice on stderr and the most specific URL of the upload on stdout."""
    console.info(f"Published {result.plan.repo_id}.")
    _echo(result.url)


_VERIFY_NOTE = {
    "ok": "sha256 matches",
    "consistent": "no sha256 recorded; size and mtime match",
    "changed": "sha256 differs from the manifest",
    "restamped": "no sha256 recorded; size or mtime differs from the record",
    "missing": "missing",
}


def render_verify(r: VerifyReport) -> None:
    """Every file and what was found (stdout); a failure as one ``Error:`` line (stderr)."""
    t = Table(title=f"[bold]{r.directory}[/bold]", title_justify="left")
    for col in ("file", "state", "checked by"):
        t.add_column(col)
    for c in r.files:
        how = "sha256" if c.known else ("size+mtime, sha256 computed" if c.sha256 else "size+mtime")
        style = "red" if c.state.bad else ("green" if c.known else "yellow")
        t.add_row(escape(c.path), f"[{style}]{_VERIFY_NOTE[c.state.value]}[/{style}]", how)
    out_console.print(t)
    if r.ok:
        unverified = sum(1 for c in r.files if not c.known)
        note = f" ({unverified} without a recorded sha256, checked by size and mtime)" if unverified else ""
        console.info(f"{r.directory} matches its manifest{note}.")
    else:
        console.error(verify_failure(r))


def verify_failure(r: VerifyReport) -> str:
    """The one sentence naming the files of a variant that fail verification."""
    bad = [f"{c.path} ({c.state.value})" for c in r.bad]
    shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    return (
        f"{shown} in {r.directory} no longer match mtpconv.json: the variant was modified "
        "after conversion. Re-run `mtpconv quantize-mtp`."
    )


def _echo(line: str) -> None:
    # Plain text, not rich markup: paths and card text may hold brackets rich would eat.
    typer.echo(line)


def _fraction(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_eval(r: EvalReport) -> None:
    """Per row and batch: same output, acceptance, decode speed; then each drafter module's kernel."""
    title = (
        f"[bold]{escape(r.variant)}[/bold] against {escape(r.source)}: k = {r.num_speculative_tokens}, "
        f"{r.max_tokens} tokens a prompt, prompts {escape(r.prompts)}; vLLM {r.vllm_version or '?'} "
        f"on {escape(r.device or '?')}"
    )
    t = Table(title=title, title_justify="left")
    for col in (
        "row",
        "runner",
        "batch",
        "same as no-spec",
        "accepted / drafted",
        "mean accepted length: served (counters)",
        "decode tok/s",
        "vs source-mtp",
        "vs no-spec",
    ):
        t.add_column(col)
    for row in r.rows:
        if row.error is not None:
            t.add_row(
                row.row.value, "-", "-", f"[red]failed[/red] (log {escape(row.log)})", "", "", "", "", ""
            )
            continue
        for b in row.batches:
            same = (
                "-"
                if b.identical is None
                else ("[green]yes[/green]" if b.identical else f"[red]no[/red] ({b.first_difference})")
            )
            accepted = f"{b.accepted} / {b.draft_tokens}" if b.draft_tokens else "-"
            lengths = (
                f"{_fraction(b.served_mean_length, 2)} (counters {_fraction(b.counter_mean_length, 2)})"
                if b.drafts
                else "-"
            )
            speed = b.decode_tokens_per_second or b.output_tokens_per_second
            t.add_row(
                row.row.value,
                row.model_runner or "-",
                str(b.batch),
                same,
                accepted,
                lengths,
                f"{speed:.1f}",
                _fraction(b.speedup_vs_source_mtp, 2),
                _fraction(b.speedup_vs_no_spec, 2),
            )
    out_console.print(t)
    kernels = Table(title="[bold]drafter modules as vLLM built them[/bold]", title_justify="left")
    for col in ("row", "module", "method", "kernel", "weight", "n"):
        kernels.add_column(col)
    for row in r.rows:
        if row.probe_error:
            kernels.add_row(
                row.row.value, "-", f"[yellow]probe failed: {escape(row.probe_error)}[/yellow]", "", "", ""
            )
        for kind, m in row.drafter_modules.items():
            kernels.add_row(
                row.row.value, escape(kind), m["method"], escape(m["kernel"]), m["dtype"], str(m["count"])
            )
    if kernels.row_count:
        out_console.print(kernels)
    for row in r.rows:
        if row.error is not None:
            console.error(f"row {row.row.value} failed: {row.error} (log: {row.log})")
