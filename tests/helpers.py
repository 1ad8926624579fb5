"""Small test utilities: hashing trees, reading tensors back."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

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
    for path in sorted(directory.glob("*.safetensors")):
        data = path.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
        header.pop("__metadata__", None)
        for name, e in header.items():
            b, end = e["data_offsets"]
            out[name] = (e["dtype"], e["shape"], data[8 + n + b : 8 + n + end])
    return out


def load_tensor(directory: Path, name: str):  # type: ignore[no-untyped-def]
    for path in sorted(directory.glob("*.safetensors")):
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
