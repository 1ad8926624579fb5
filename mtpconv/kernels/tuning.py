"""The measured tuning tables: one JSON file per device under ``mtpconv/kernels/tuned/``, one loader.

A file (``tuned/<device name, spaces as underscores>.json``) holds, for the shapes a sweep
measured on that device (keys ``(token bucket, N, K)``, :func:`token_bucket`):

* ``skinny``: the skinny GEMM's launch on BF16 rows (:class:`Entry`);
* ``prepared``: its launch on FP8 rows quantized per token beforehand;
* ``skinny_token`` / ``scaled_mm_fused``: the shapes on which :func:`mtpconv.kernels.fp8_linear`
  picks those kernels at 2-16 tokens (:mod:`mtpconv.kernels.linear`).

A device without a file of its own takes :data:`FALLBACK`'s, the one device measured so far.
:func:`replaced` puts another table in place of every device's while it is active: how a
benchmark times candidate entries through ``fp8_linear`` without an environment switch.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, NamedTuple

import torch

Key = tuple[int, int, int]  # (token bucket, N, K)
FALLBACK = "NVIDIA_H200"  # the table of every device without its own file


class Entry(NamedTuple):
    """One measured launch of the skinny GEMM (``waves``: resident programs per SM; ``split``:
    K pieces per tile, 0 for the fewest that fill the waves; ``first_ahead``: narrow-GEMV K
    steps whose weight tiles are loaded before the PDL wait)."""

    dot: bool
    block_n: int
    block_k: int
    warps: int
    stages: int
    waves: int
    mma: int
    tma: bool
    narrow: bool
    split: int = 0
    first_ahead: int = 0


@dataclass(frozen=True)
class Tuning:
    """One device's tables (see the module docstring)."""

    device: str
    skinny: Mapping[Key, Entry]
    prepared: Mapping[Key, Entry]
    skinny_token: frozenset[Key]
    scaled_mm_fused: frozenset[Key]


def token_bucket(m: int) -> int | None:
    """The measured token count that stands for ``m`` rows: 1, 4 (2-4) or 16 (5-16); None beyond."""
    if m == 1:
        return 1
    if m <= 4:
        return 4
    return 16 if m <= 16 else None


def _key(row: Mapping[str, Any]) -> Key:
    return int(row["tokens"]), int(row["n"]), int(row["k"])


def _entries(rows: list[dict[str, Any]]) -> dict[Key, Entry]:
    fields = Entry._fields
    return {_key(row): Entry(**{f: row[f] for f in fields if f in row}) for row in rows}


def parse(text: str) -> Tuning:
    """A tuning file's text as a :class:`Tuning` (``ValueError`` naming what is missing)."""
    try:
        doc = json.loads(text)
        return Tuning(
            device=str(doc["device"]),
            skinny=_entries(doc["skinny"]),
            prepared=_entries(doc["prepared"]),
            skinny_token=frozenset(tuple(map(int, key)) for key in doc["skinny_token"]),  # type: ignore[misc]
            scaled_mm_fused=frozenset(tuple(map(int, key)) for key in doc["scaled_mm_fused"]),  # type: ignore[misc]
        )
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a tuning table: {exc!r}") from None


def file_name(device_name: str) -> str:
    """``"NVIDIA H200"`` -> ``"NVIDIA_H200.json"``."""
    return device_name.replace(" ", "_") + ".json"


@functools.lru_cache(maxsize=8)
def load(device_name: str) -> Tuning:
    """The table measured on ``device_name`` (as torch names the device), else :data:`FALLBACK`'s."""
    folder = resources.files("mtpconv.kernels").joinpath("tuned")
    path = folder.joinpath(file_name(device_name))
    if not path.is_file():
        path = folder.joinpath(FALLBACK + ".json")
    return parse(path.read_text(encoding="utf-8"))


_replacement: Tuning | None = None


@functools.lru_cache(maxsize=16)
def _device_name(index: int) -> str:
    return str(torch.cuda.get_device_name(index))


def for_device(device: torch.device | None = None) -> Tuning:
    """The table for launches on ``device`` (None: :data:`FALLBACK`'s), or the one
    :func:`replaced` put in place."""
    if _replacement is not None:
        return _replacement
    if device is None or device.type != "cuda":
        return load(FALLBACK.replace("_", " "))
    return load(_device_name(device.index or 0))


@contextlib.contextmanager
def replaced(table: Tuning) -> Iterator[Tuning]:
    """Every device takes ``table`` while the context is active (a benchmark's candidates)."""
    global _replacement
    before, _replacement = _replacement, table
    try:
        yield table
    finally:
        _replacement = before
