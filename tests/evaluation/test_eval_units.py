"""``mtpconv eval`` without vLLM: its usage errors, the report's arithmetic, the rows' plugin switch,
and what publish and verify make of a saved report."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.evaluation import runner
from mtpconv.evaluation.probe import module_kind
from mtpconv.evaluation.report import EvalReport, build_report
from mtpconv.evaluation.rows import Row
from mtpconv.evaluation.runner import RowOutcome, row_environment
from mtpconv.manifest import EVAL_REPORT_NAME
from tests.helpers import run_cli, worker_batch


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny BF16 Qwen3.5 source and its variant (no vLLM needed to write them)."""
    from mtpconv.commands.quantize_mtp import quantize_mtp

    root = tmp_path_factory.mktemp("eval_pair")
    src = write_checkpoint(root / "src", Spec(family="qwen3_5"))
    quantize_mtp(str(src), root / "var")
    return src, root / "var"


@pytest.fixture
def rows_never_served(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a row was served despite an error found before")

    monkeypatch.setattr(runner, "run_row", refuse)


def _one_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    return lines[0]


@pytest.mark.usefixtures("rows_never_served")
@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--batch", "0"], 2, "batch sizes are positive integers"),
        (["--batch", "1,x"], 2, "'1,x'"),
        (["--rows", "no-spec,fast"], 2, "unknown row fast"),
        (["--engine-arg", "max_model_len"], 2, "KEY=VALUE"),
        (["--engine-arg", "model=other"], 2, "set model and speculative_config themselves"),
        (["-k", "0"], 2, "-k"),
    ],
)
def test_command_line_mistakes_exit_2_before_any_row(
    pair: tuple[Path, Path], args: list[str], code: int, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src, var = pair
    got, out, err = run_cli(["eval", str(src), str(var), *args], capsys)
    assert got == code and out == ""
    assert words in _one_error(err)
    assert not (var / EVAL_REPORT_NAME).exists()


@pytest.mark.usefixtures("rows_never_served")
def test_a_bad_prompts_line_is_named_before_any_row(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n{"promt": "typo"}\n')
    src, var = pair
    code, _, err = run_cli(["eval", str(src), str(var), "--prompts", str(prompts)], capsys)
    assert code == 2 and f"{prompts} line 2" in _one_error(err)


@pytest.mark.usefixtures("rows_never_served")
def test_a_directory_without_a_manifest_is_not_a_variant(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src, _ = pair
    code, _, err = run_cli(["eval", str(src), str(src)], capsys)
    assert code == 1 and "has no mtpconv.json: it is not a variant" in _one_error(err)


@pytest.mark.usefixtures("rows_never_served")
def test_a_missing_path_is_a_usage_error(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, var = pair
    code, _, err = run_cli(["eval", str(tmp_path / "nowhere"), str(var)], capsys)
    assert code == 2 and "does not exist" in _one_error(err)


@pytest.mark.usefixtures("rows_never_served")
def test_no_vllm_installed_is_one_clear_error(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    src, var = pair
    code, _, err = run_cli(["eval", str(src), str(var)], capsys)
    assert code == 1 and "vLLM, which is not installed: pip install 'mtpconv[vllm]'" in _one_error(err)


def test_module_kinds_fold_layer_and_expert_numbers() -> None:
    assert module_kind("model.layers.3.mlp.experts.17.down_proj") == "model.layers.mlp.experts.down_proj"
    assert (
        module_kind("model.mtp_layers.36.mtp_block.self_attn.qkv_proj")
        == "model.mtp_layers.mtp_block.self_attn.qkv_proj"
    )
    assert module_kind("lm_head") == "lm_head"


def test_only_the_plugin_row_loads_mtpconv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "other_plugins", lambda: ["lora_x"])
    assert "VLLM_PLUGINS" not in row_environment(Row.VARIANT_PLUGIN, {})
    assert row_environment(Row.VARIANT_PLUGIN, {"VLLM_PLUGINS": "lora_x"})["VLLM_PLUGINS"] == "lora_x,mtpconv"
    assert row_environment(Row.VARIANT_PLUGIN, {"VLLM_PLUGINS": "mtpconv"})["VLLM_PLUGINS"] == "mtpconv"
    for row in (Row.NO_SPEC, Row.SOURCE_MTP, Row.VARIANT_STOCK):
        assert row_environment(row, {})["VLLM_PLUGINS"] == "lora_x"
        assert row_environment(row, {"VLLM_PLUGINS": "mtpconv, lora_x"})["VLLM_PLUGINS"] == "lora_x"
        assert row_environment(row, {"VLLM_PLUGINS": "mtpconv"})["VLLM_PLUGINS"] == "none"


def _outcome(row: Row, *batches: dict[str, Any]) -> RowOutcome:
    result = {
        "row": row.value,
        "vllm_version": "0.0",
        "device": "test",
        "model_runner": "v1",
        "batches": list(batches),
    }
    return RowOutcome(row, result, None, Path(f"{row.value}.log"), 1.0)


def _report(outcomes: list[RowOutcome], max_tokens: int = 3) -> EvalReport:
    """The report of ``outcomes``, k = 3, built-in prompts."""
    return build_report(
        outcomes,
        source="s",
        variant="v",
        num_speculative_tokens=3,
        max_tokens=max_tokens,
        prompts="built-in",
        command="c",
    )


def test_served_mean_length_counts_only_tokens_the_requests_received() -> None:
    ref = [[1, 2, 3, 4, 5, 6, 7], [9, 10, 11, 12, 13, 14, 15]]
    outcomes = [
        _outcome(Row.NO_SPEC, worker_batch(2, ref, 0, 0, 0, 1.2)),
        # 7 tokens a request, k = 3: the prefill gives one, then 2 verify steps give 4 + 2 served
        # tokens; vLLM's counters accepted all 3 drafts of both steps (the last past the end).
        _outcome(Row.SOURCE_MTP, worker_batch(2, ref, 4, 12, 12, 0.6)),
        _outcome(Row.VARIANT_PLUGIN, worker_batch(2, [ref[0], [9, 10, 11, 0, 0, 0, 0]], 4, 12, 9, 0.5)),
    ]
    report = _report(outcomes, max_tokens=7)
    no_spec, source, plugin = (r.batches[0] for r in report.rows)
    assert no_spec.identical is None and no_spec.decode_tokens_per_second == pytest.approx(12 / 1.2)
    assert source.identical is True and source.counter_mean_length == 4.0
    assert source.served_mean_length == pytest.approx(12 / 4)  # 6 decoded tokens a request, 2 steps
    assert source.speedup_vs_no_spec == pytest.approx((12 / 0.6) / (12 / 1.2))
    assert plugin.identical is False and plugin.first_difference == "request 1, token 3"
    assert plugin.speedup_vs_source_mtp == pytest.approx((12 / 0.5) / (12 / 0.6))
    assert report.vllm_version == "0.0" and report.ok


def test_a_failed_row_is_reported_and_the_report_is_not_ok() -> None:
    failed = RowOutcome(Row.VARIANT_STOCK, None, "exit 1: ValueError: no weight_scale", Path("x.log"), 2.0)
    report = _report([failed])
    assert not report.ok and report.rows[0].error == "exit 1: ValueError: no weight_scale"
    assert report.to_dict()["rows"][0]["batches"] == []


def _saved_report() -> dict[str, Any]:
    ref = [[1, 2, 3]]
    report = build_report(
        [
            _outcome(Row.NO_SPEC, worker_batch(1, ref, 0, 0, 0, 1.0)),
            _outcome(Row.VARIANT_PLUGIN, worker_batch(1, ref, 1, 2, 2, 0.5)),
        ],
        source="src",
        variant="var",
        num_speculative_tokens=2,
        max_tokens=3,
        prompts="built-in",
        command="mtpconv eval src var -k 2",
    )
    return report.to_dict()


def test_publish_puts_a_saved_report_on_the_card_and_uploads_it(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from mtpconv.commands.publish import plan_publish

    var = tmp_path / "var"
    shutil.copytree(pair[1], var)
    (var / EVAL_REPORT_NAME).write_text(json.dumps(_saved_report()))
    assert run_cli(["verify", str(var)], capsys)[0] == 0
    plan = plan_publish(var, repo_id="me/var", offline=True)
    assert EVAL_REPORT_NAME in [item.path_in_repo for item in plan.items]
    card = plan.card or ""
    assert "## Measured in vLLM" in card and "`mtpconv eval src var -k 2` with vLLM 0.0 on test" in card
    assert "| variant-plugin | 1 | yes | 2 / 2 | 2.00 | 4.0 | - |" in card


def test_a_broken_saved_report_is_named(pair: tuple[Path, Path], tmp_path: Path) -> None:
    import shutil

    from mtpconv.commands.publish import plan_publish
    from mtpconv.errors import ManifestError

    var = tmp_path / "var"
    shutil.copytree(pair[1], var)
    (var / EVAL_REPORT_NAME).write_text("{not json")
    with pytest.raises(ManifestError, match="mtpconv-eval.json is not a report of `mtpconv eval`"):
        plan_publish(var, repo_id="me/var", offline=True)


def test_a_failed_row_names_the_cause_not_vllms_summary(tmp_path: Path) -> None:
    from mtpconv.evaluation.runner import error_from_log

    log = tmp_path / "variant-stock.log"
    log.write_text(
        "(EngineCore pid=1) ERROR [core.py:1330] EngineCore failed to start.\n"
        "(EngineCore pid=1) ERROR [core.py:1330] ValueError: There is no module or parameter named "
        "'fc.weight_scale' in Qwen3NextMultiTokenPredictor.\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    assert error_from_log(log, 1) == (
        "exit 1: ValueError: There is no module or parameter named 'fc.weight_scale' in "
        "Qwen3NextMultiTokenPredictor."
    )
    (tmp_path / "quiet.log").write_text("killed\n")
    assert error_from_log(tmp_path / "quiet.log", -9) == "exit -9: killed"
    assert error_from_log(tmp_path / "quiet.log", None) == "killed"  # the exit code is not known
    assert error_from_log(tmp_path / "no.log", None) == "no output"


def test_an_out_of_memory_row_says_what_to_change(tmp_path: Path) -> None:
    from mtpconv.evaluation.runner import OUT_OF_MEMORY_HINT, error_from_log

    # The variant-plugin row's last words on the H100 (vLLM 0.26.0, Model Runner V2, Qwen3-Next)
    log = tmp_path / "variant-plugin.log"
    log.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.18 GiB of which 916.19 MiB is free. Including non-PyTorch memory, this process "
        "has 78.28 GiB memory in use. Of the allocated memory 75.17 GiB is allocated by PyTorch, with "
        "489.00 MiB allocated in private pools (e.g., CUDA Graphs), and 2.17 GiB is reserved by PyTorch "
        "but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    assert error_from_log(log, 1) == (
        "exit 1: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        f"capacity of 79.18 GiB of which 916.19 MiB is free. ({OUT_OF_MEMORY_HINT})"
    )
    assert "gpu_memory_utilization or max_num_seqs" in OUT_OF_MEMORY_HINT
    # another error is left as it was
    log.write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert (
        error_from_log(log, 1) == "exit 1: RuntimeError: CUDA error: an illegal memory access was encountered"
    )


def _refused_stock_outcomes(vllm_version: str) -> list[RowOutcome]:
    """source-mtp served by ``vllm_version``; the variant's stock row failed at load."""
    served = _outcome(Row.SOURCE_MTP, worker_batch(1, [[1, 2, 3]], 1, 2, 2, 0.5))
    assert served.result is not None
    served.result["vllm_version"] = vllm_version
    refused = RowOutcome(
        Row.VARIANT_STOCK, None, "exit 1: ValueError: no 'fc.weight_scale'", Path("x.log"), 2.0
    )
    return [served, refused]


@pytest.mark.parametrize(
    ("version", "declared", "explained"),
    [
        ("0.26.0", ["FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"], True),
        ("0.29.1", ["FP8_PER_CHANNEL_PER_TOKEN"], True),
        ("0.30.0", ["FP8_PER_CHANNEL_PER_TOKEN"], False),
        ("0.32.0+cpu", ["FP8_PB_WO"], False),
        ("0.26.0", ["FP8"], False),  # not a declaration quantize-mtp writes: no claim about it
        ("dev", ["FP8_PER_CHANNEL_PER_TOKEN"], False),
    ],
)
def test_a_stock_refusal_by_an_older_vllm_says_why(
    version: str, declared: list[str], explained: bool
) -> None:
    from mtpconv.evaluation.report import explain_stock_refusal

    report = _report(_refused_stock_outcomes(version))
    explain_stock_refusal(report, declared)
    error = report.rows[1].error
    assert error is not None and error.startswith("exit 1: ValueError: no 'fc.weight_scale'")
    assert (f"(expected: vLLM {version} predates 0.30, the first release" in error) is explained
    assert report.rows[0].error is None


def test_eval_explains_the_stock_row_from_the_variants_manifest(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mtpconv.commands import evaluate as command
    from mtpconv.manifest import read_manifest

    src, var = pair
    manifest = read_manifest(var)
    assert manifest is not None and manifest.drafter.declaration == "standard"
    monkeypatch.setattr(command, "require_vllm", lambda: None)
    monkeypatch.setattr(command, "run_rows", lambda *_a, **_k: _refused_stock_outcomes("0.26.0"))
    got = command.evaluate(str(src), str(var), rows=[Row.SOURCE_MTP, Row.VARIANT_STOCK], save=False)
    algos = ", ".join(sorted(set(manifest.drafter.declared_algorithms.values())))
    error = got.rows[1].error
    assert (
        error is not None and f"builds this variant's FP8 drafter ({algos}); serve it with a newer" in error
    )


@pytest.mark.usefixtures("rows_never_served")
def test_a_broken_manifest_stops_eval_before_any_row(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    src, var = pair
    broken = tmp_path / "var"
    shutil.copytree(var, broken)
    (broken / "mtpconv.json").write_text("{not json")
    code, _, err = run_cli(["eval", str(src), str(broken)], capsys)
    assert code == 1 and "mtpconv.json" in _one_error(err)
