"""Interrupted, killed, out-of-space and concurrent conversions leave no half-written variant.

The signal tests start ``python -m mtpconv quantize-mtp`` as a real subprocess on
a checkpoint whose drafter is ~115 MB (so writing takes a few seconds), wait
until the hidden temporary directory has bytes in it, and signal the process.
A full disk is simulated in-process: every file opened for writing under the
destination's parent fails with ENOSPC once a byte budget is spent.
"""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.errors import MtpconvError
from mtpconv.manifest import read_manifest
from mtpconv.variant_check import bad_files
from tests.helpers import run_cli, tree_digest
from tests.test_reliability import snapshot

REPO = Path(__file__).resolve().parents[1]
TMP_MARK = ".mtpconv-tmp-"

# hidden 1024, intermediate 16384: the drafter is ~57M parameters (~115 MB in BF16),
# the whole single-file checkpoint ~230 MB, all of it rewritten by quantize-mtp.
BIG = Spec(
    family="qwen3_5", hidden=1024, intermediate=16384, layers=1, heads=8, kv_heads=2, head_dim=128, vocab=1024
)


@pytest.fixture(scope="module")
def big_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("big"), BIG)


@pytest.fixture(scope="module")
def big_digest(big_src: Path) -> dict[str, str]:
    return tree_digest(big_src)


def _start(src: Path, dst: Path, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.pop("MTPCONV_DEBUG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "mtpconv", "quantize-mtp", str(src), str(dst), "--device", "cpu", *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _temp_dirs(dst: Path) -> list[Path]:
    return sorted(dst.parent.glob(f".{dst.name}{TMP_MARK}*"))


def _wait_mid_write(proc: subprocess.Popen[str], dst: Path, timeout: float = 60.0) -> Path:
    """Block until the temporary output exists and holds a partly written file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"finished before it could be interrupted (rc {proc.returncode}):\n{err}")
        for tmp in _temp_dirs(dst):
            try:
                if any(p.stat().st_size > 0 for p in tmp.glob("*.safetensors") if p.stat().st_nlink == 1):
                    return tmp
            except FileNotFoundError:
                continue
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("the conversion never started writing")


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def _one_error(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_write_leaves_nothing(
    sig: signal.Signals, big_src: Path, big_digest: dict[str, str], tmp_path: Path
) -> None:
    dst = tmp_path / "out" / "big-mtpfp8"
    proc = _start(big_src, dst)
    _wait_mid_write(proc, dst)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    line = _one_error(err)
    assert "interrupted" in line and str(dst) in line
    assert _leftovers(dst.parent) == []  # no variant, no temp dir, no lock file
    assert tree_digest(big_src) == big_digest


def test_sigkill_then_next_run_cleans_up(big_src: Path, big_digest: dict[str, str], tmp_path: Path) -> None:
    dst = tmp_path / "out" / "big-mtpfp8"
    proc = _start(big_src, dst)
    stale = _wait_mid_write(proc, dst)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert stale.exists() and not dst.exists()  # what a SIGKILL leaves: a hidden temp dir only
    # The next run into the same destination removes it and succeeds.
    proc = _start(big_src, dst)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert _leftovers(dst.parent) == [dst.name]
    manifest = read_manifest(dst)
    assert manifest is not None and bad_files(dst, manifest) == []
    assert tree_digest(big_src) == big_digest


@pytest.fixture(scope="module")
def vocab_world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tokenizer checkpoint and a ~25 MB corpus (counting it takes many seconds)."""
    import json

    from fixtures.tokenizers import generate_text, write_tiny_tokenizer

    root = tmp_path_factory.mktemp("vocab")
    src = write_tiny_tokenizer(root / "src", vocab_size=300)
    (src / "config.json").write_text(json.dumps({"vocab_size": 320}))
    block = "\n".join(generate_text(2000, seed=5)) + "\n"
    corpus = root / "corpus.txt"
    corpus.write_text(block * (25_000_000 // len(block)), encoding="utf-8")
    return src, corpus


def _wait_reading(proc: subprocess.Popen[str], path: Path, timeout: float = 60.0) -> None:
    """Block until ``proc`` has ``path`` open (Linux /proc), i.e. counting has started."""
    deadline = time.monotonic() + timeout
    fd_dir = Path(f"/proc/{proc.pid}/fd")
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"finished before it could be interrupted:\n{proc.communicate()[1]}")
        try:
            if any(os.readlink(fd) == str(path) for fd in fd_dir.iterdir()):
                return
        except OSError:
            pass
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("the corpus was never opened")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_while_counting_tokens(
    sig: signal.Signals, vocab_world: tuple[Path, Path], tmp_path: Path
) -> None:
    src, corpus = vocab_world
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mtpconv",
            "build-draft-vocab",
            str(src),
            "--corpus",
            str(corpus),
            "--size",
            "16",
            "--output",
            str(out / "ids.pt"),
        ],
        cwd=REPO,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_reading(proc, corpus)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in _one_error(err)
    assert not out.exists() or _leftovers(out) == []


def test_stale_temp_with_our_own_pid_is_removed(tmp_path: Path) -> None:
    """A SIGKILLed run in a container often had the pid the next run gets (1, 7, ...):
    its leftovers are still removed, since only the lock holder writes a destination."""
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5"))
    out = tmp_path / "out"
    stale = out / f".v{TMP_MARK}{os.getpid()}-deadbeef"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half written")
    (out / ".v.mtpconv.lock").touch()  # a SIGKILL leaves the lock file too
    quantize_mtp(str(src), out / "v", device="cpu")
    assert _leftovers(out) == ["v"]


# --------------------------------------------------------------------------- full disk


class _FullDisk:
    """Files opened for writing under ``root`` fail with ENOSPC once ``budget`` bytes are
    written (``budget=None``: never fail, just count)."""

    def __init__(self, root: Path, budget: int | None) -> None:
        self.root = str(root)
        self.budget = budget
        self.written = 0
        self.failed = False
        self._open = builtins.open

    def open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = self._open(file, mode, *args, **kwargs)
        path = os.path.abspath(os.fspath(file)) if isinstance(file, (str, os.PathLike)) else ""
        if path.startswith(self.root) and any(c in mode for c in "wxa+"):
            return _Counting(f, self)
        return f


class _Counting:
    def __init__(self, f: Any, disk: _FullDisk) -> None:
        self._f = f
        self._disk = disk

    def write(self, data: Any) -> int:
        n = len(data)
        disk = self._disk
        if disk.budget is not None and disk.written + n > disk.budget:
            disk.failed = True
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        disk.written += n
        return int(self._f.write(data))

    def __enter__(self) -> _Counting:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@pytest.fixture(scope="module")
def small_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(
        tmp_path_factory.mktemp("small"), Spec(family="qwen3_5_moe", quant="nvfp4", shards=2)
    )


def _disk(monkeypatch: pytest.MonkeyPatch, root: Path, budget: int | None) -> _FullDisk:
    disk = _FullDisk(root, budget)
    monkeypatch.setattr(builtins, "open", disk.open)
    monkeypatch.setattr(shutil, "_USE_CP_SENDFILE", False)  # copies go through write()
    return disk


def _bytes_written(
    monkeypatch: pytest.MonkeyPatch, args: list[str], out: Path, capsys: pytest.CaptureFixture[str]
) -> int:
    with monkeypatch.context() as m:
        disk = _disk(m, out, None)
        code, _, err = run_cli(args, capsys)
    assert code == 0, err
    shutil.rmtree(out)
    out.mkdir()
    return disk.written


COMMANDS = {
    "quantize-mtp": lambda src, out: ["quantize-mtp", str(src), str(out / "v"), "--device", "cpu"],
    "quantize-mtp --copy": lambda src, out: [
        "quantize-mtp",
        str(src),
        str(out / "v"),
        "--device",
        "cpu",
        "--copy",
    ],
    "fix-exclusions --copy": lambda src, out: ["fix-exclusions", str(src), str(out / "v"), "--copy"],
}


@pytest.mark.parametrize("where", ["first-byte", "middle", "last-byte"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_full_disk(
    command: str,
    where: str,
    small_src: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    args = COMMANDS[command](small_src, out)
    total = _bytes_written(monkeypatch, args, out, capsys)
    budget = {"first-byte": 0, "middle": total // 2, "last-byte": total - 1}[where]
    before = snapshot(small_src)
    disk = _disk(monkeypatch, out, budget)
    code, _, err = run_cli(args, capsys)
    monkeypatch.undo()
    assert disk.failed
    assert code == 1, err
    line = _one_error(err)
    assert "no space left" in line.lower(), line
    assert _leftovers(out) == []
    assert snapshot(small_src) == before


# --------------------------------------------------------------------------- concurrency


def test_two_processes_one_destination(big_src: Path, big_digest: dict[str, str], tmp_path: Path) -> None:
    """Two conversions into one destination at once: exactly one wins, the other is told
    why, and the variant is complete."""
    dst = tmp_path / "out" / "big-mtpfp8"
    first = _start(big_src, dst)
    _wait_mid_write(first, dst)
    second = _start(big_src, dst)
    _, err2 = second.communicate(timeout=120)
    _, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1
    assert second.returncode == 1, err2
    line = _one_error(err2)
    assert str(dst) in line and ("another mtpconv process" in line or "already exists" in line), line
    assert _leftovers(dst.parent) == [dst.name]
    manifest = read_manifest(dst)
    assert manifest is not None and bad_files(dst, manifest) == []
    assert tree_digest(big_src) == big_digest


def test_racing_threads_one_destination(small_src: Path, tmp_path: Path) -> None:
    """Four threads start quantize_mtp into one destination at the same instant."""
    dst = tmp_path / "out" / "v"
    barrier = threading.Barrier(4)
    results: list[str] = []

    def convert() -> None:
        barrier.wait()
        try:
            quantize_mtp(str(small_src), dst, device="cpu")
            results.append("ok")
        except MtpconvError as exc:
            results.append(f"error: {exc}")

    threads = [threading.Thread(target=convert) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 4
    errors = [r for r in results if r != "ok"]
    assert results.count("ok") == 1, results
    for e in errors:
        assert "another mtpconv process" in e or "already exists" in e, e
    assert _leftovers(dst.parent) == ["v"]
    manifest = read_manifest(dst)
    assert manifest is not None and bad_files(dst, manifest) == []
