"""The library's messages never name a flag of mtpconv's command line (issue 46).

Outside ``mtpconv/cli/`` a message names the library's parameter (:class:`mtpconv.errors.Param`)
and the command line writes the flag. Every string in the library's code is checked
against every flag the CLI declares; docstrings and comments may describe the CLI.
Other tools' flags (``vllm serve --speculative-config`` in a model card) are not ours.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer
from typer.core import TyperGroup

import mtpconv
from mtpconv.cli import app

PACKAGE = Path(mtpconv.__file__).parent


def _cli_flags() -> set[str]:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    params = [param for command in [group, *group.commands.values()] for param in command.params]
    return {opt for param in params for opt in param.opts if opt.startswith("--")}


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant of the code (f-string parts too), docstrings left out."""
    bare = [node.value for node in ast.walk(tree) if isinstance(node, ast.Expr)]
    docstrings = {
        id(value) for value in bare if isinstance(value, ast.Constant) and isinstance(value.value, str)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_the_cli_declares_the_flags_this_test_looks_for() -> None:
    assert {"--force", "--size", "--corpus", "--text-field", "--repo-id", "--quiet"} <= _cli_flags()


def test_no_library_string_names_a_cli_flag() -> None:
    flag = re.compile("|".join(rf"(?<![\w-]){re.escape(f)}(?![\w-])" for f in sorted(_cli_flags())))
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "cli" not in path.relative_to(PACKAGE).parts[:1]
        for line, text in _strings(ast.parse(path.read_text(), str(path)))
        if flag.search(text)
    ]
    assert not found, "\n".join(found)
