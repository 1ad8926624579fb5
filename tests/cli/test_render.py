"""mtpconv.cli.render: what the records look like on stdout, and a light CLI start-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mtpconv.cli import render
from mtpconv.commands.fix_exclusions import FixReport
from mtpconv.commands.publish import PublishPlan, PublishResult, UploadItem


def _plan(card: str | None = "---\nlicense: other\n---\n# Card\n") -> PublishPlan:
    items = [
        UploadItem("config.json", 512, Path("/v/config.json")),
        UploadItem("model.safetensors", 3 * 1024 * 1024, Path("/v/model.safetensors")),
    ]
    if card is not None:
        items.append(UploadItem("README.md", len(card), None))
    return PublishPlan(
        Path("/v"),
        "me/x-mtpfp8",
        items,
        card,
        private=False,
        revision="dev",
        create_pr=True,
        commit_message="Upload",
    )


def test_publish_plan_listing(capsys: pytest.CaptureFixture[str]) -> None:
    render.render_publish_plan(_plan())
    out, err = capsys.readouterr()
    lines = out.splitlines()
    total = 512 + 3 * 1024 * 1024 + len("---\nlicense: other\n---\n# Card\n")
    assert (
        lines[0]
        == f"Would upload 3 files ({total / 1024 / 1024:.2f} MiB) to me/x-mtpfp8 @ dev as a pull request:"
    )
    assert lines[1] == f"  {'512 B':>12}  config.json"
    assert lines[2] == f"  {'3.00 MiB':>12}  model.safetensors"
    assert lines[3].endswith("  README.md  (generated)")
    assert "--- README.md (generated) ---\n---\nlicense: other\n---\n# Card\n" in out
    assert err == ""


def test_publish_plan_with_kept_card_shows_no_card(capsys: pytest.CaptureFixture[str]) -> None:
    render.render_publish_plan(_plan(card=None))
    out, _ = capsys.readouterr()
    assert "(generated)" not in out and "--- README.md" not in out


def test_publish_result_prints_the_most_specific_url(capsys: pytest.CaptureFixture[str]) -> None:
    render.render_publish_result(
        PublishResult(_plan(), repo_url="https://hf.co/me/x", pr_url="https://hf.co/me/x/discussions/1")
    )
    out, err = capsys.readouterr()
    assert out == "https://hf.co/me/x/discussions/1\n"
    assert err == "Published me/x-mtpfp8.\n"


def test_fix_report(capsys: pytest.CaptureFixture[str]) -> None:
    render.render_fix(FixReport("src", "dst", ["mtp.fc"], in_place=False, dry_run=True))
    assert capsys.readouterr().out == "Would exclude in dst: mtp.fc\n"
    render.render_fix(FixReport("src", "src", [], in_place=True))
    assert capsys.readouterr().out.startswith("Nothing to fix")


def test_json_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    render.render_json(FixReport("src", "dst", ["mtp.fc"], in_place=False))
    assert json.loads(capsys.readouterr().out)["newly_excluded"] == ["mtp.fc"]


def test_cli_start_up_imports_no_command_module() -> None:
    """``mtpconv --help`` stays fast: the command modules (torch, huggingface_hub) load lazily."""
    heavy = [
        "torch",
        "huggingface_hub",
        "mtpconv.commands.quantize_mtp",
        "mtpconv.commands.inspect",
        "mtpconv.commands.publish",
        "mtpconv.commands.build_draft_vocab",
        "mtpconv.commands.fix_exclusions",
    ]
    code = f"import sys, mtpconv.cli; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_stock_view_is_one_row_per_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """Dozens of drafter linears with one reason make one row; the modules are counted."""
    from mtpconv.quantconfig.stock_view import ModuleKind, StockRow, StockView, ViewOf

    rows = [StockRow(f"mtp.layers.{i}.mlp.down_proj", ModuleKind.DENSE, "FP8", "dense") for i in range(5)]
    rows += [StockRow("mtp.layers.0.mlp.experts.down_proj", ModuleKind.EXPERTS, "FP8_PB_WO", "blocks", 8)]
    rows += [StockRow("mtp.eh_proj", ModuleKind.PLAIN, "BF16", "nn.Linear")]
    render._render_stock_view(StockView(ViewOf.SOURCE, "mixed", "reason", rows))
    out = capsys.readouterr().out
    assert "5 modules: mtp.layers.0.mlp.down_proj, ..." in out
    assert "8 modules: mtp.layers.0.mlp.experts.down_proj" in out and "experts.down_proj, ..." not in out
    assert "mtp.eh_proj" in out and "1 modules" not in out
    assert "mtp.layers.4" not in out  # the full list is --json's


def test_inspect_table_folds_routed_experts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fixtures.checkpoints import Spec, write_checkpoint
    from mtpconv.commands.inspect import inspect_checkpoint

    write_checkpoint(tmp_path, Spec(family="qwen3_5_moe", experts=8))
    report = inspect_checkpoint(str(tmp_path))
    expert_rows = [r for r in report.drafter if ".experts." in r.name]
    assert len(expert_rows) == 8 * 3  # --json and the report keep every tensor
    console_width = render.out_console.width
    render.out_console.width = 200  # room for the full names
    try:
        render.render_inspect(report)
    finally:
        render.out_console.width = console_width
    out = capsys.readouterr().out
    tensor_table = out.split("Drafter tensors")[1].split("Drafter bytes")[0]
    folded = [line for line in tensor_table.splitlines() if "mtp.layers.0.mlp.experts.*." in line]
    assert len(folded) == 3 and all(line.rstrip(" │").endswith(" 8") for line in folded)
    assert "experts.3." not in tensor_table
