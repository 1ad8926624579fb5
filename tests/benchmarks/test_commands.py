"""Every command docs/BENCHMARKS.md gives for a figure exists and answers ``--help`` (CPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "BENCHMARKS.md"


def programs() -> list[tuple[str, ...]]:
    """The programs the document's commands run: ``("-m", module)`` or ``(script,)``."""
    text = DOC.read_text(encoding="utf-8")
    found = {("-m", m) for m in re.findall(r"python -m (benchmarks(?:\.\w+)+)", text)}
    found |= {(s,) for s in re.findall(r"python (scripts/\w+\.py)", text)}
    return sorted(found)


def test_the_document_names_the_drafter_step_and_its_sweep() -> None:
    assert ("-m", "benchmarks.draft_step") in programs()
    assert ("-m", "benchmarks.sweep_skinny") in programs()
    assert "## GPU end to end in vLLM" in DOC.read_text(encoding="utf-8")


@pytest.mark.parametrize("program", programs(), ids=" ".join)
def test_every_benchmark_command_answers_help(program: tuple[str, ...]) -> None:
    if len(program) == 1:
        assert (ROOT / program[0]).is_file(), program
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    )
    done = subprocess.run(
        [sys.executable, *program, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
