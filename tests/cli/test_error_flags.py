"""A library error names the library's parameters; the command line writes each as its flag.

The message is written once, in the library (:class:`mtpconv.errors.Param`): ``str(error)``
reads ``size=66`` / ``force=True``, ``mtpconv`` prints ``--size 66`` / ``--force`` for the
option of the running command that has the parameter's name, and the library's form for
a parameter that command does not take.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpconv.checkpoint.source import resolve_source
from mtpconv.errors import EvalError, MtpconvError, Param, PublishError, SourceError
from tests.helpers import run_cli


def test_a_parameter_reads_as_a_keyword_to_a_library_caller() -> None:
    error = MtpconvError(Param("size", 66), " and ", Param("force", True), " and ", Param("text_field"), ".")
    assert str(error) == "size=66 and force=True and text_field."
    assert str(Param("repo_id", "USER/NAME")) == "repo_id='USER/NAME'"
    assert str(Param("output", Path("ids.pt"))) == "output=ids.pt"
    assert str(MtpconvError("plain text")) == "plain text"


def test_the_same_failure_names_the_keyword_in_the_library_and_the_flag_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SourceError) as info:
        resolve_source(str(tmp_path), "v1")
    assert str(info.value) == f"revision applies to Hub repo ids, not the local path {tmp_path}."

    code, _, err = run_cli(["inspect", str(tmp_path), "--revision", "v1"], capsys)
    assert code == 1
    assert err.splitlines() == [f"Error: --revision applies to Hub repo ids, not the local path {tmp_path}."]


@pytest.mark.parametrize(
    ("module", "function", "error", "argv", "expected"),
    [
        (
            "mtpconv.commands.publish",
            "plan_publish",
            PublishError,
            ["publish", "DIR"],
            "--repo-id me/x, --private, --revision; size=66.",
        ),
        (
            "mtpconv.commands.evaluate",
            "evaluate",
            EvalError,
            ["eval", "SRC", "VARIANT"],
            "repo_id='me/x', private=True, revision; --num-speculative-tokens 66.",
        ),
    ],
)
def test_each_parameter_is_written_as_the_running_commands_flag_or_as_the_library_writes_it(
    module: str,
    function: str,
    error: type[MtpconvError],
    argv: list[str],
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A value, a switch and a bare name; the long flag of ``-k/--num-speculative-tokens``;
    ``eval`` takes no ``--repo-id``, ``--private`` or ``--revision``, ``publish`` no ``size``."""
    import importlib

    def fail(*_args: object, **_kwargs: object) -> None:
        last = Param("k", 66) if argv[0] == "eval" else Param("size", 66)
        raise error(
            Param("repo_id", "me/x"), ", ", Param("private", True), ", ", Param("revision"), "; ", last, "."
        )

    monkeypatch.setattr(importlib.import_module(module), function, fail)
    code, _, err = run_cli(argv, capsys)
    assert code == 1 and err.splitlines() == [f"Error: {expected}"], err
