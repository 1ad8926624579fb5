"""One line per row and batch from the reports ``run_on_device.sh`` writes (``mtpconv eval --json``):
``python -m benchmarks.gpu_e2e.summarize OUT/*.json`` -- what a device call prints to its log."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def lines(path: Path) -> list[str]:
    """``file row runner batch accepted/drafted tok/s identical`` for each row and batch of a report."""
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"{path.name}: unreadable ({exc})"]
    out = []
    for row in report.get("rows", []):
        if row.get("error"):
            out.append(f"{path.name} {row['row']}: error {row['error'][:200]}")
            continue
        for b in row.get("batches", []):
            out.append(
                f"{path.name} {row['row']} {row.get('model_runner')} b{b['batch']}: "
                f"{b.get('accepted')}/{b.get('draft_tokens')} accepted, "
                f"{_rate(b.get('decode_tokens_per_second'))} tok/s, identical {b.get('identical_to_no_spec')}"
            )
    return out


def main(argv: list[str]) -> int:
    for name in argv:
        print("\n".join(lines(Path(name))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
