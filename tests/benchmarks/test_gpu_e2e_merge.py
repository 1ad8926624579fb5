"""benchmarks.gpu_e2e.merge_rows: one eval report from rows served by several runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu_e2e.merge_rows import MergeError, main, merge
from mtpconv.evaluation.rows import Row, RowJob
from tests.helpers import worker_batch

OUTPUTS = [[5, 6, 7, 8]]


def _write_row(directory: Path, row: Row, *, decode: float, accepted: int, **job_changes: Any) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    job = RowJob(
        row=row,
        model="/m/var" if row.serves_variant else "/m/src",
        prompts=[{"prompt": "p"}],
        batches=[1],
        max_tokens=4,
        num_speculative_tokens=3,
        engine_args={"max_model_len": 64},
    ).to_json()
    (directory / f"{row.value}.job.json").write_text(json.dumps({**job, **job_changes}))
    drafts = 0 if row is Row.NO_SPEC else 1
    batch = worker_batch(1, OUTPUTS, drafts, 3 * drafts, accepted, decode)
    result = {"row": row.value, "vllm_version": "0.26.0", "device": "test", "model_runner": "v2"}
    (directory / f"{row.value}.result.json").write_text(json.dumps({**result, "batches": [batch]}))
    (directory / f"{row.value}.log").write_text("served\n")


def test_rows_of_two_runs_compare_as_one_report(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    _write_row(first, Row.NO_SPEC, decode=0.3, accepted=0)
    _write_row(first, Row.SOURCE_MTP, decode=0.2, accepted=3)
    _write_row(second, Row.VARIANT_PLUGIN, decode=0.1, accepted=3)
    stock_job = json.loads((second / "variant-plugin.job.json").read_text())
    (second / "variant-stock.job.json").write_text(json.dumps({**stock_job, "row": "variant-stock"}))
    (second / "variant-stock.log").write_text(
        "ValueError: There is no module or parameter named 'fc.weight_scale'\n"
    )
    out = tmp_path / "merged.json"
    assert main([str(out), str(first), str(second)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["source"], doc["variant"], doc["vllm_version"]) == ("/m/src", "/m/var", "0.26.0")
    rows = {r["row"]: r for r in doc["rows"]}
    assert list(rows) == ["no-spec", "source-mtp", "variant-stock", "variant-plugin"]
    plugin = rows["variant-plugin"]["batches"][0]
    assert plugin["identical_to_no_spec"] is True
    assert plugin["speedup_vs_source_mtp"] == pytest.approx(0.2 / 0.1)
    assert (
        rows["variant-stock"]["error"]
        == "ValueError: There is no module or parameter named 'fc.weight_scale'"
    )


def test_a_row_named_twice_comes_from_the_last_directory(tmp_path: Path) -> None:
    _write_row(tmp_path / "a", Row.SOURCE_MTP, decode=0.2, accepted=3)
    _write_row(tmp_path / "a", Row.VARIANT_PLUGIN, decode=0.4, accepted=0)
    _write_row(tmp_path / "b", Row.VARIANT_PLUGIN, decode=0.1, accepted=3)
    doc = merge([tmp_path / "a", tmp_path / "b"])
    plugin = doc["rows"][1]["batches"][0]
    assert plugin["accepted"] == 3 and plugin["speedup_vs_source_mtp"] == pytest.approx(2.0)


def test_runs_asked_for_different_things_are_not_merged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_row(tmp_path / "a", Row.SOURCE_MTP, decode=0.2, accepted=3)
    _write_row(
        tmp_path / "b", Row.VARIANT_PLUGIN, decode=0.1, accepted=3, engine_args={"enforce_eager": True}
    )
    with pytest.raises(MergeError, match="variant-plugin was run with another engine_args than source-mtp"):
        merge([tmp_path / "a", tmp_path / "b"])
    out = tmp_path / "merged.json"
    assert main([str(out), str(tmp_path / "empty")]) == 1 and not out.exists()
    assert "no <row>.job.json in" in capsys.readouterr().err


def test_an_unreadable_row_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_row(tmp_path / "a", Row.SOURCE_MTP, decode=0.2, accepted=3)
    (tmp_path / "a" / "source-mtp.result.json").write_text("{cut")
    out = tmp_path / "merged.json"
    assert main([str(out), str(tmp_path / "a")]) == 1 and not out.exists()
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and "source-mtp.result.json is unreadable" in err
    (tmp_path / "a" / "source-mtp.job.json").write_text('{"row": "source-mtp"}')
    with pytest.raises(MergeError, match="has no model, prompts, batches, .*: not a job mtpconv eval wrote"):
        merge([tmp_path / "a"])
