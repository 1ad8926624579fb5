"""Help screens: commands in workflow order with their one-line help whole and an example
under each; arguments named as the README writes them, flags without a metavar, choices
listed, no range or type artefacts on option rows, and the shared switches on every command.

Two artefacts typer 0.29's public API cannot avoid stay on argument rows: the usage line
writes a required argument as ``{SRC}`` and an argument row adds its type (``SRC <str>``).
"""

from __future__ import annotations

import re

import pytest

from tests.helpers import run_cli

# The workflow, as the README runs it and the help lists it.
COMMANDS = [
    "inspect",
    "quantize-mtp",
    "build-draft-vocab",
    "fix-exclusions",
    "set-draft-window",
    "verify",
    "publish",
    "eval",
]


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


def _command_rows(text: str) -> dict[str, str]:
    """The ``Commands:`` section: each command and its help (continuation lines joined)."""
    rows: dict[str, str] = {}
    section = text.split("\nCommands:\n", 1)[1]
    for line in section.splitlines():
        match = re.match(r"  (\S+)\s{2,}(.*)", line)
        if match:
            name = match.group(1)
            rows[name] = match.group(2)
        elif line.startswith("   ") and rows:
            rows[name] += " " + line.strip()
    return rows


def test_commands_in_workflow_order_with_their_whole_summary(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = _help(capsys)
    rows = _command_rows(text)
    assert list(rows) == COMMANDS
    from mtpconv.cli.app import app

    for name, shown in rows.items():
        (info,) = [c for c in app.registered_commands if c.name == name]
        summary = " ".join((info.callback.__doc__ or "").split("\n\n")[0].split())
        assert shown == summary and not shown.endswith("..."), name
    assert max(map(len, text.splitlines())) <= 80


@pytest.mark.parametrize("command", COMMANDS)
def test_an_example_under_each_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _help(capsys, command).splitlines()
    assert lines[-2].strip() == "Example:"
    assert lines[-1].strip().startswith(f"mtpconv {command} ")


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_no_range_or_type_artefacts_on_option_rows(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, *([command] if command else []))
    assert not re.search(r"x[<>]=|range>", text), text
    for line in _option_lines(text):
        assert not re.search(r"<(str|path|int|float|text)", line), line


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
        ("set-draft-window", "set-draft-window [OPTIONS] {DIR} [N]"),
        ("verify", "verify [OPTIONS] {DIR}"),
        ("publish", "publish [OPTIONS] {DIR}"),
        ("eval", "eval [OPTIONS] {SRC} {VARIANT}"),
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
    for shown in ("--repo-id USER/NAME", "--revision BRANCH", "--token TOKEN", "--json"):
        assert shown in text, shown


def test_bare_command_prints_help_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli([], capsys)
    assert code == 2 and out == ""
    assert err.startswith("Usage: ") and "quantize-mtp" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from mtpconv import __version__

    assert run_cli(["--version"], capsys) == (0, f"mtpconv {__version__}\n", "")
