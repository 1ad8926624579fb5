"""README "Where things live" against the tree: every path the table lists exists, and
every module directory and top-level module of ``mtpconv/`` is listed."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "mtpconv"
_ROW = re.compile(r"^\| (.+?) \| (.+) \|$")
_CODE = re.compile(r"`([^`]+)`")


def _rows() -> list[tuple[list[str], list[str]]]:
    """(paths, names in the job column) of each row of the table."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Where things live\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        match = _ROW.match(line)
        if match and match.group(1) != "path" and not set(match.group(1)) <= {"-", "|"}:
            rows.append((_CODE.findall(match.group(1)), _CODE.findall(match.group(2))))
    assert rows, "no table under '## Where things live'"
    return rows


def _resolve(token: str) -> Path:
    """A path as the table writes it: from the repo root, or else inside ``mtpconv/``."""
    top = ("mtpconv", "benchmarks", "fixtures", "scripts", "tests")
    return REPO / token if token.split("/")[0] in top else PACKAGE / token


def test_every_listed_path_exists() -> None:
    for paths, names in _rows():
        for token in paths:
            path = _resolve(token)
            assert path.is_dir() if token.endswith("/") else path.is_file(), f"README lists {token}"
        # the files a directory row names in its job column are in one of its directories
        directories = [_resolve(t) for t in paths if t.endswith("/")]
        for name in names:
            if directories and name.endswith(".py") and "/" not in name:
                assert any((d / name).is_file() for d in directories), f"README names {name} in {paths}"


def test_every_module_directory_and_top_level_module_is_listed() -> None:
    listed = {_resolve(token).resolve() for paths, _ in _rows() for token in paths}
    modules = [p for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    packages = [p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()]
    missing = sorted(str(p.relative_to(REPO)) for p in [*modules, *packages] if p.resolve() not in listed)
    assert not missing, f"README 'Where things live' does not list {missing}"


def test_every_command_module_is_named() -> None:
    (names,) = [names for paths, names in _rows() if paths == ["mtpconv/commands/"]]
    modules = sorted(p.stem for p in (PACKAGE / "commands").glob("*.py") if p.name != "__init__.py")
    assert sorted(names) == modules
