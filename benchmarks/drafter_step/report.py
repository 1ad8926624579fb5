"""The drafter-step benchmark's tables (markdown) from its rows."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from benchmarks.drafter_step.variants import fp8_variants


@dataclass
class Row:
    model: str
    tokens: int
    variant: str
    head: str
    us: float
    bytes: int
    tbps: float
    pct_copy: float
    distinct_experts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def srows_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | linear | N x K | tokens | best config | us | TB/s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["rank"] == 0:
            lines.append(
                f"| {r['model']} | {r['linear']} | {r['n']}x{r['k']} | {r['tokens']} | "
                f"{r['config']} | {r['us']:.1f} | {r['tbps']:.2f} |"
            )
    return "\n".join(lines)


def markdown(rows: list[Row], copy_tbps: float, variants: list[str]) -> str:
    lines = [f"Copy bandwidth (D2D, read+write): {copy_tbps:.2f} TB/s", ""]
    models = list(dict.fromkeys(r.model for r in rows))
    fp8s = fp8_variants(variants)
    for model in models:
        mrows = [r for r in rows if r.model == model]
        full = next(r.head for r in mrows if r.head != "32k")
        lines += [f"#### {model}", ""]
        head = f"| tokens | BF16+{full} | BF16+32k |"
        sep = "|---|---|---|"
        for v in fp8s:
            head += f" {v}+{full} | {v}+32k |"
            sep += "---|---|"
        lines += [head, sep]
        for t in sorted({r.tokens for r in mrows}):

            def get(v: str, hd: str, t: int = t, mrows: list[Row] = mrows) -> Row:
                for r in mrows:
                    if r.tokens == t and r.variant == v and r.head == hd:
                        return r
                return Row("", t, v, hd, math.nan, 0, math.nan, math.nan)

            line = f"| {t} | {get('bf16', full).us:.1f} | {get('bf16', '32k').us:.1f} |"
            for v in fp8s:
                line += f" {get(v, full).us:.1f} | {get(v, '32k').us:.1f} |"
            lines.append(line)
        lines += ["", "Ratios (FP8 path + 32k head over BF16), achieved bandwidth of FP8+32k:", ""]
        lines += [
            "| tokens | path | /BF16+32k | /BF16+full | FP8+32k TB/s (% copy) | BF16+32k TB/s |",
            "|---|---|---|---|---|---|",
        ]
        for t in sorted({r.tokens for r in mrows}):
            b32 = get("bf16", "32k", t)
            bfull = get("bf16", full, t)
            for v in fp8s:
                r = get(v, "32k", t)
                lines.append(
                    f"| {t} | {v} | {r.us / b32.us:.2f} | {r.us / bfull.us:.3f} | "
                    f"{r.tbps:.2f} ({r.pct_copy:.0f}%) | {b32.tbps:.2f} |"
                )
        lines.append("")
    return "\n".join(lines)


def micro_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| linear | N x K | tokens | variant | us | TB/s | queued TB/s |", "|---" * 7 + "|"]
    for r in rows:
        lines.append(
            f"| {r['linear']} | {r['n']}x{r['k']} | {r['tokens']} | {r['variant']} | "
            f"{r['us']:.2f} | {r['tbps']:.2f} | {r['tbps_queued']:.2f} |"
        )
    return "\n".join(lines)
