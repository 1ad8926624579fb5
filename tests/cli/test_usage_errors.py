"""Usage errors: exit 2, one ``Error:`` line on stderr, before anything is read or
written; and the shared switches work after the command as well as before it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_cli, tree_digest


def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    return lines[0]


@pytest.fixture
def library_never_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seam: a usage error must stop before the command's library function."""
    import mtpconv.commands.fix_exclusions
    import mtpconv.commands.quantize_mtp

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the library was called despite a usage error")

    monkeypatch.setattr(mtpconv.commands.quantize_mtp, "quantize_mtp", refuse)
    monkeypatch.setattr(mtpconv.commands.fix_exclusions, "fix_exclusions", refuse)


@pytest.mark.usefixtures("library_never_called")
@pytest.mark.parametrize(
    ("flag", "value", "names"),
    [
        ("--device", "gpu", ["'--device'", "'gpu'", "'auto', 'cpu', 'cuda'"]),
        ("--draft-head-dtype", "fp16", ["'--draft-head-dtype'", "'fp16'", "'fp8', 'bf16'"]),
    ],
)
def test_wrong_choice_is_a_usage_error(
    flag: str,
    value: str,
    names: list[str],
    bf16_next: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    digest = tree_digest(bf16_next)
    code, out, err = run_cli(["quantize-mtp", str(bf16_next), str(tmp_path / "v"), flag, value], capsys)
    assert code == 2 and out == ""
    line = _one_error_line(err)
    for name in names:
        assert name in line, line
    assert list(tmp_path.iterdir()) == []  # no DST, no temporary directory
    assert tree_digest(bf16_next) == digest


@pytest.mark.usefixtures("library_never_called")
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["quantize-mtp"], "Missing argument 'SRC'"),
        (["quantize-mtp", "SRCDIR"], "Missing argument 'DST'"),
        (["quantize-mtp", "SRCDIR", "OUT", "--bogus"], "No such option: --bogus"),
        (["quantize-mtp", "SRCDIR", "OUT", "--draft-vocab", "OUT/none.pt"], "'--draft-vocab'"),
        (["fix-exclusions", "SRCDIR"], "--in-place"),
        (["fix-exclusions", "SRCDIR", "OUT", "--in-place"], "either DST or --in-place"),
        (["build-draft-vocab", "SRCDIR", "--size", "8"], "Missing option '--corpus'"),
        (["build-draft-vocab", "SRCDIR", "--size", "0", "--corpus", "SRCDIR"], "'--size'"),
        (["no-such-command"], "No such command"),
    ],
)
def test_usage_errors_are_one_line(
    args: list[str], needle: str, bf16_next: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    digest = tree_digest(bf16_next)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    argv = [a.replace("SRCDIR", str(bf16_next)).replace("OUT", str(out_dir / "v")) for a in args]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == ""
    assert needle in _one_error_line(err)
    assert list(out_dir.iterdir()) == []
    assert tree_digest(bf16_next) == digest


def test_console_script_usage_error_is_one_line(bf16_next: Path, tmp_path: Path) -> None:
    """The real entry point (``python -m mtpconv``), not only the in-process one."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtpconv",
            "quantize-mtp",
            str(bf16_next),
            str(tmp_path / "v"),
            "--device",
            "gpu",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "'--device'" in _one_error_line(done.stderr)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["after", "before"])
@pytest.mark.parametrize("switch", ["--quiet", "-q"])
def test_quiet_before_or_after_the_command(
    switch: str, where: str, bf16_next: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["inspect", str(bf16_next), switch] if where == "after" else [switch, "inspect", str(bf16_next)]
    code, out, err = run_cli(args, capsys)
    assert (code, err) == (0, "")
    assert "MTP layers" in out


def test_quiet_silences_notices(bf16_next: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        ["quantize-mtp", str(bf16_next), str(tmp_path / "v"), "--device", "cpu", "--dry-run", "--json", "-q"],
        capsys,
    )
    assert (code, err) == (0, "")
    assert '"plan"' in out


@pytest.mark.parametrize("where", ["after", "before"])
def test_debug_before_or_after_the_command(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MTPCONV_DEBUG", raising=False)
    missing = str(tmp_path / "missing")
    args = ["inspect", missing, "--debug"] if where == "after" else ["--debug", "inspect", missing]
    code, out, err = run_cli(args, capsys)
    assert code == 1 and out == ""
    assert "Traceback" in err and err.splitlines()[-1].startswith("Error: ")
    # The switch lasts one run: the next command without it shows one line again.
    code, _, err = run_cli(["inspect", missing], capsys)
    assert code == 1 and "Traceback" not in err
    _one_error_line(err)
