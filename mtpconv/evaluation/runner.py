"""Start one fresh Python process per row, each running :mod:`mtpconv.evaluation.worker`.

A row that leaves mtpconv's plugin out gets ``VLLM_PLUGINS`` listing every other
installed vLLM plugin (``none`` when there is no other), so only ours is switched off;
the plugin row gets the user's allowlist with ``mtpconv`` added where one is set.
Each row's output goes to its own log file; a row that fails is recorded with the
last lines of its log and the others still run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from mtpconv.errors import Interrupted
from mtpconv.evaluation.rows import PLUGIN_NAME, Row, RowJob


@dataclass
class RowOutcome:
    """What one row's process left: its result document, or why it has none."""

    row: Row
    result: dict[str, Any] | None
    error: str | None
    log: Path
    seconds: float


def other_plugins() -> list[str]:
    """Names of the installed ``vllm.general_plugins`` entry points other than mtpconv's."""
    return sorted({ep.name for ep in entry_points(group="vllm.general_plugins")} - {PLUGIN_NAME})


def row_environment(row: Row, base: dict[str, str]) -> dict[str, str]:
    """``base`` with ``VLLM_PLUGINS`` set so that mtpconv's plugin is on exactly for the plugin row.

    ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` lets vLLM's engine process receive the drafter probe
    (a Python function; :mod:`mtpconv.evaluation.probe`) when the engine runs in its own process.
    """
    env = dict(base)
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    if row.plugin:
        allowed = env.get("VLLM_PLUGINS")
        if allowed is not None and PLUGIN_NAME not in [n.strip() for n in allowed.split(",")]:
            env["VLLM_PLUGINS"] = ",".join(n for n in (allowed, PLUGIN_NAME) if n)
        return env
    allowed = env.get("VLLM_PLUGINS")
    names = other_plugins() if allowed is None else [n.strip() for n in allowed.split(",")]
    env["VLLM_PLUGINS"] = ",".join(n for n in names if n and n != PLUGIN_NAME) or "none"
    return env


_RAISED = re.compile(r"\b(\w+(?:Error|Exception)): (.+)$")
# What vLLM's front end raises after its engine process failed: the cause is logged before it.
_SUMMARIES = ("Engine core initialization failed",)
# torch's words for a CUDA allocation that failed; what follows them is allocator detail.
_OUT_OF_MEMORY = re.compile(r"CUDA out of memory\..*? is free\.")
OUT_OF_MEMORY_HINT = (
    "the GPU ran out of memory on this row; a lower gpu_memory_utilization or max_num_seqs "
    "engine argument gives vLLM more room"
)


def _explained(cause: str) -> str:
    """``cause``, where it is torch's out-of-memory message, cut to its first sentences and
    followed by what to change."""
    m = _OUT_OF_MEMORY.search(cause)
    return f"{cause[: m.end()]} ({OUT_OF_MEMORY_HINT})" if m else cause


def error_from_log(log: Path, code: int | None) -> str:
    """The row's cause of failure from its log: the last exception that is not vLLM's summary,
    after the process's exit code where it is known."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.is_file() else []
    raised = [m.group(0) for m in (_RAISED.search(ln) for ln in lines) if m]
    causes = [r for r in raised if not any(s in r for s in _SUMMARIES)] or raised
    tail = [ln.strip() for ln in lines if ln.strip()]
    cause = _explained(causes[-1]) if causes else (tail[-1] if tail else "no output")
    return cause if code is None else f"exit {code}: {cause}"


def run_row(job: RowJob, workdir: Path, env: dict[str, str]) -> RowOutcome:
    """Run ``job`` in a fresh process; its log is ``workdir/<row>.log``."""
    job_file = workdir / f"{job.row.value}.job.json"
    out_file = workdir / f"{job.row.value}.result.json"
    log = workdir / f"{job.row.value}.log"
    job_file.write_text(json.dumps(job.to_json()), encoding="utf-8")
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mtpconv.evaluation.worker", str(job_file), str(out_file)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=row_environment(job.row, env),
            start_new_session=True,  # vLLM's own processes die with the group on interrupt
        )
        try:
            code = proc.wait()
        except KeyboardInterrupt as exc:
            _stop(proc)
            raise Interrupted(f"interrupted while serving the {job.row.value} row (log: {log}).") from exc
    seconds = time.perf_counter() - started
    if code == 0 and out_file.is_file():
        return RowOutcome(job.row, json.loads(out_file.read_text(encoding="utf-8")), None, log, seconds)
    return RowOutcome(job.row, None, error_from_log(log, code), log, seconds)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def run_rows(
    jobs: Sequence[RowJob],
    workdir: Path,
    *,
    notify: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
) -> list[RowOutcome]:
    """Every job in order, one fresh process each; ``notify`` hears a line per row."""
    base = dict(os.environ if env is None else env)
    outcomes = []
    for i, job in enumerate(jobs, start=1):
        if notify:
            notify(f"row {i}/{len(jobs)}: {job.row.value} ({job.row.description}) ...")
        outcome = run_row(job, workdir, base)
        if notify:
            status = "done" if outcome.error is None else f"failed: {outcome.error}"
            notify(f"row {i}/{len(jobs)}: {job.row.value} {status} in {outcome.seconds:.0f} s")
        outcomes.append(outcome)
    return outcomes
