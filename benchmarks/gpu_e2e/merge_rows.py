"""One ``mtpconv eval`` report from rows served by several eval runs on one machine.

Qwen3-Next's no-spec row under Model Runner V2 took 274 s to start on the H100, so its rows do
not fit one 600 s device call together. Each row of ``mtpconv eval`` is a fresh process anyway:
run them in back-to-back calls (``ROWS=source-mtp TAG=a run_on_device.sh next v2``, then
``ROWS=variant-plugin TAG=b ...``), then merge what each run left in its work directory
(``<row>.job.json``, ``<row>.result.json``, ``<row>.log``) into the report one run would have
written, compared by ``mtpconv.evaluation.report.build_report``::

    python -m benchmarks.gpu_e2e.merge_rows OUT.json /tmp/e2e/rows-next-v2-*/mtpconv-eval-*

A row found in several directories is taken from the last one named. The runs must have asked
the same of every row (prompts, batches, tokens, k, engine arguments, seed); otherwise nothing is
written and the difference is named.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mtpconv.evaluation.report import build_report
from mtpconv.evaluation.rows import Row
from mtpconv.evaluation.runner import RowOutcome, error_from_log

_SAME = ("prompts", "batches", "max_tokens", "num_speculative_tokens", "engine_args", "seed")


class MergeError(Exception):
    """The runs cannot be compared as one."""


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MergeError(f"{path} is unreadable ({exc})") from exc
    if not isinstance(doc, dict):
        raise MergeError(f"{path} is not a JSON object")
    return doc


def _row_files(directories: list[Path]) -> dict[Row, tuple[dict[str, Any], Path]]:
    found: dict[Row, tuple[dict[str, Any], Path]] = {}
    for directory in directories:
        for row in Row:
            job = directory / f"{row.value}.job.json"
            if job.is_file():
                doc = _read(job)
                missing = [k for k in ("model", *_SAME) if k not in doc]
                if missing:
                    raise MergeError(f"{job} has no {', '.join(missing)}: not a job mtpconv eval wrote")
                found[row] = (doc, directory)
    if not found:
        raise MergeError("no <row>.job.json in " + ", ".join(map(str, directories)))
    return found


def merge(directories: list[Path]) -> dict[str, Any]:
    """The report (``EvalReport.to_dict()``) of every row the directories hold."""
    found = _row_files(directories)
    rows = sorted(found, key=list(Row).index)
    first_job = found[rows[0]][0]
    for row in rows[1:]:
        job = found[row][0]
        for key in _SAME:
            if job.get(key) != first_job.get(key):
                raise MergeError(f"{row.value} was run with another {key} than {rows[0].value}")
    outcomes = []
    for row in rows:
        directory = found[row][1]
        result, log = directory / f"{row.value}.result.json", directory / f"{row.value}.log"
        if result.is_file():
            outcomes.append(RowOutcome(row, _read(result), None, log, 0.0))
        else:
            outcomes.append(RowOutcome(row, None, error_from_log(log, None), log, 0.0))
    model = {r: found[r][0]["model"] for r in rows}
    source = next((model[r] for r in rows if not r.serves_variant), "-")
    variant = next((model[r] for r in rows if r.serves_variant), "-")
    report = build_report(
        outcomes,
        source=source,
        variant=variant,
        num_speculative_tokens=int(first_job["num_speculative_tokens"]),
        max_tokens=int(first_job["max_tokens"]),
        prompts="as run",
        command="python -m benchmarks.gpu_e2e.merge_rows " + " ".join(map(str, directories)),
    )
    return report.to_dict()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the merged report (JSON)")
    parser.add_argument("directories", type=Path, nargs="+", help="eval work directories, in order")
    args = parser.parse_args(argv)
    try:
        doc = merge(args.directories)
    except MergeError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
