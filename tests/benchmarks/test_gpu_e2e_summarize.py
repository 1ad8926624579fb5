"""The device call's one-line summary of ``mtpconv eval --json`` reports."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu_e2e.summarize import lines


def _batch(
    batch: int, accepted: int, drafted: int, tps: float | None, identical: bool | None
) -> dict[str, object]:
    return {
        "batch": batch,
        "accepted": accepted,
        "draft_tokens": drafted,
        "decode_tokens_per_second": tps,
        "identical_to_no_spec": identical,
    }


def test_one_line_per_row_and_batch_and_errors_named(tmp_path: Path) -> None:
    report = {
        "rows": [
            {
                "row": "variant-plugin",
                "error": None,
                "model_runner": "v2",
                "batches": [
                    _batch(1, 33, 2949, 119.94, None),
                    _batch(8, 2316, 5340, 1869.5, True),
                    _batch(16, 0, 0, None, None),
                ],
            },
            {"row": "variant-stock", "error": "no module named fc.weight_scale", "batches": []},
        ]
    }
    path = tmp_path / "mimo-v2.json"
    path.write_text(json.dumps(report))
    assert lines(path) == [
        "mimo-v2.json variant-plugin v2 b1: 33/2949 accepted, 119.9 tok/s, identical None",
        "mimo-v2.json variant-plugin v2 b8: 2316/5340 accepted, 1869.5 tok/s, identical True",
        "mimo-v2.json variant-plugin v2 b16: 0/0 accepted, - tok/s, identical None",
        "mimo-v2.json variant-stock: error no module named fc.weight_scale",
    ]


def test_an_unreadable_report_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "next-v1.json"
    path.write_text("{cut short")
    (line,) = lines(path)
    assert line.startswith("next-v1.json: unreadable (")
