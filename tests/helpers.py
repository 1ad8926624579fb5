"""Small test utilities: hashing trees, reading tensors back, comparing kernel outputs, eval row results."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open


def tree_digest(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` (relative path -> digest)."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = Path(root) / name
            out[str(path.relative_to(directory))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def raw_tensors(directory: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """Every tensor of a checkpoint as (dtype, shape, raw bytes), read by safetensors itself."""
    import json
    import struct

    out = {}
    # The draft head's own file (mtpconv/) belongs to the checkpoint too.
    for path in sorted([*directory.glob("*.safetensors"), *directory.glob("mtpconv/*.safetensors")]):
        data = path.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
        header.pop("__metadata__", None)
        for name, e in header.items():
            b, end = e["data_offsets"]
            out[name] = (e["dtype"], e["shape"], data[8 + n + b : 8 + n + end])
    return out


def load_tensor(directory: Path, name: str):  # type: ignore[no-untyped-def]
    # The draft head's own file (mtpconv/) belongs to the checkpoint too.
    for path in sorted([*directory.glob("*.safetensors"), *directory.glob("mtpconv/*.safetensors")]):
        with safe_open(str(path), "pt") as f:
            if name in f.keys():  # noqa: SIM118
                return f.get_tensor(name)
    raise KeyError(name)


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    """Run ``mtpconv ARGS`` in-process: (exit code, stdout, stderr)."""
    from mtpconv.cli import main

    capsys.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def populate_hub_cache(repo_id: str, src: Path, files: Collection[str] | None = None) -> Path:
    """Lay ``src`` out as huggingface_hub's cache does: snapshot files link into blobs/.

    Uses the cache huggingface_hub currently points at (tests point it at a temporary
    ``HF_HOME``); returns the snapshot directory. ``files`` limits which files appear.
    """
    from huggingface_hub import constants

    repo = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / HUB_COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(HUB_COMMIT)
    for path in sorted(p for p in src.rglob("*") if p.is_file()):  # the mtpconv/ folder too
        rel = path.relative_to(src).as_posix()
        if files is not None and rel not in files:
            continue
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        blob.write_bytes(path.read_bytes())
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative L2 error of ``got`` against ``want``, computed in float64."""
    return float((got.double() - want.double()).norm() / want.double().norm())


def worker_batch(
    batch: int, outputs: list[list[int]], drafts: int, draft_tokens: int, accepted: int, decode: float
) -> dict[str, Any]:
    """One batch of an eval row's result, as ``mtpconv.evaluation.worker`` writes it."""
    return {
        "batch": batch,
        "outputs": outputs,
        "requests": len(outputs),
        "generated": sum(len(o) for o in outputs),
        "decode_seconds": decode,
        "wall_seconds": decode * 1.25,
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted": accepted,
    }
