"""Help screens: arguments named as the README writes them, flags without a metavar,
choices listed, and the shared switches on every command."""

from __future__ import annotations

import re

import pytest

from tests.helpers import run_cli

COMMANDS = ["inspect", "quantize-mtp", "fix-exclusions", "build-draft-vocab", "publish"]


def _help(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = run_cli([*args, "--help"], capsys)
    assert code == 0 and err == "", err
    return out


def _option_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith("-")]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_no_type_placeholders(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, *([command] if command else []))
    for placeholder in ("<bool>", "<list", "{source}", "{destination}", "{directory}"):
        assert placeholder not in text, f"{placeholder} in:\n{text}"
    options = _option_lines(text)
    assert options and not [line for line in options if "<str>" in line or "<path>" in line]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_quiet_and_debug(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    options = _option_lines(_help(capsys, command))
    assert any(re.match(r"\s+-q, --quiet\s{2,}No progress", line) for line in options)
    assert any(re.match(r"\s+--debug\s{2,}Show tracebacks", line) for line in options)


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        ("inspect", "inspect [OPTIONS] {SRC}"),
        ("quantize-mtp", "quantize-mtp [OPTIONS] {SRC} {DST}"),
        ("fix-exclusions", "fix-exclusions [OPTIONS] {SRC} [DST]"),
        ("build-draft-vocab", "build-draft-vocab [OPTIONS] {SRC}"),
        ("publish", "publish [OPTIONS] {DIR}"),
    ],
)
def test_arguments_named_as_in_the_readme(
    command: str, usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _help(capsys, command).splitlines()[0]
    assert first.startswith("Usage: ") and first.endswith(usage), first


def test_quantize_lists_choices_and_flags_take_no_value(capsys: pytest.CaptureFixture[str]) -> None:
    options = _option_lines(_help(capsys, "quantize-mtp"))
    assert any(re.match(r"\s+--device <auto\|cpu\|cuda>\s+.*\[default: auto\]", line) for line in options)
    assert any(re.match(r"\s+--draft-head-dtype <fp8\|bf16>\s+.*\[default: fp8\]", line) for line in options)
    assert any(re.match(r"\s+--draft-vocab IDS\.pt\s", line) for line in options)
    assert any(re.match(r"\s+--revision REV\s", line) for line in options)
    for flag in ("--dry-run", "--force", "--copy", "--json", "--help"):
        assert any(re.match(rf"\s+{flag}\s{{2,}}[A-Z]", line) for line in options), flag


def test_build_draft_vocab_metavars(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, "build-draft-vocab")
    for shown in ("--corpus PATH", "--size K", "-o, --output IDS.pt", "--eval-corpus PATH", "--plot PNG"):
        assert shown in text, shown


def test_publish_metavars(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, "publish")
    for shown in ("--repo-id USER/NAME", "--revision BRANCH", "--token TOKEN"):
        assert shown in text, shown


def test_bare_command_prints_help_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli([], capsys)
    assert code == 2 and out == ""
    assert err.startswith("Usage: ") and "quantize-mtp" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from mtpconv import __version__

    assert run_cli(["--version"], capsys) == (0, f"mtpconv {__version__}\n", "")
