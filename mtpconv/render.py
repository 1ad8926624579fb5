"""Rich rendering of the records that commands return (tables on stderr/stdout)."""

from __future__ import annotations

from rich.table import Table

from mtpconv.commands.quantize_mtp import ConversionReport
from mtpconv.console import human_bytes, out_console
from mtpconv.findings import Severity
from mtpconv.fix_exclusions import FixReport
from mtpconv.inspect import InspectReport

_SEVERITY_STYLE = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def render_inspect(r: InspectReport) -> None:
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
    summary.add_row("MTP layers", f"{r.mtp_layers_found} found / "
                    f"{r.mtp_layers_declared if r.mtp_layers_declared is not None else '-'} declared")
    summary.add_row("weights", f"{human_bytes(r.total_bytes)} in {r.shards} shard(s)")
    if r.variant:
        summary.add_row("variant", f"mtpconv {r.variant['tool'].get('version', '?')}, "
                        f"{r.variant['fp8_linears']} FP8 drafter linears")
    dv = r.draft_vocab
    summary.add_row("draft vocab", "none" if dv is None else
                    f"{dv['file']} ({dv['size'] or '?'} ids, head {dv['head_dtype'] or '?'})")
    c.print(summary)

    if r.drafter:
        t = Table(title="Drafter tensors", title_justify="left")
        for col in ("tensor", "dtype", "shape", "stored", "role", "declared"):
            t.add_column(col)
        for row in r.drafter:
            declared = row.declared or ("unquantized" if row.role in ("linear", "head") else "")
            t.add_row(row.name, row.dtype, "x".join(map(str, row.shape)) or "scalar", row.format,
                      row.role, declared)
        c.print(t)

    if r.cost is not None:
        k = r.cost
        t = Table(title="Drafter bytes read per draft step (1 token)", title_justify="left")
        for col in ("", "stack", "head", "total"):
            t.add_column(col, justify="right")
        t.add_row("now", human_bytes(k.stack_now), human_bytes(k.head_now), human_bytes(k.total_now))
        t.add_row("FP8 drafter", human_bytes(k.stack_fp8), human_bytes(k.head_now),
                  human_bytes(k.total_fp8))
        t.add_row(f"FP8 + {k.draft_vocab_size}-row FP8 head", human_bytes(k.stack_fp8),
                  human_bytes(k.head_fp8_truncated), human_bytes(k.total_fp8_truncated))
        c.print(t)

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


def render_conversion(r: ConversionReport) -> None:
    c = out_console
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
        t.add_row("draft head", f"{p.draft_head.tensor} [{p.draft_head.rows} x "
                  f"{p.draft_head.hidden}] {p.draft_head.dtype}")
    t.add_row("weights", f"{human_bytes(p.bytes_before)} -> {human_bytes(p.bytes_after)} "
              f"(saved {human_bytes(p.bytes_before - p.bytes_after)})")
    if not r.dry_run:
        t.add_row("max relative L2 error", f"{r.max_rel_l2:.4%}")
        t.add_row("files linked / copied", f"{r.linked} / {r.copied}")
        t.add_row("device / time", f"{r.device} / {r.seconds:.1f} s")
    c.print(t)


def render_fix(r: FixReport) -> None:
    c = out_console
    if not r.excluded:
        c.print("Nothing to fix: every module stored unquantized is already excluded.")
        return
    verb = "Would exclude" if r.dry_run else "Excluded"
    c.print(f"{verb} in {r.destination}: " + ", ".join(r.excluded))
    for b in r.backups:
        c.print(f"backup: {b}")
