"""Rewriting one planned shard: a reader thread, the FP8 math, a writer thread.

The source shard is read front to back (the plan orders its tensors by offset)
and hashed by those same reads; drafter linears are quantized to FP8 in the
calling thread; the output is hashed as it is written and fsynced once. Bounded
queues between the stages keep a few tensors in memory, however large the shard.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch

from mtpconv.checkpoint.index import CheckpointFiles
from mtpconv.checkpoint.reader import ShardReader, ShardStream
from mtpconv.checkpoint.safetensors_io import tensor_from_bytes, torch_dtype
from mtpconv.checkpoint.writer import ShardWriter, tensor_bytes
from mtpconv.errors import ConversionError
from mtpconv.formats.fp8 import (
    Fp8Tensor,
    NonFiniteWeightError,
    QuantError,
    quantize_fp8_checked,
    stored_scale,
)
from mtpconv.formats.nvfp4 import dequantize_nvfp4, dequantize_nvfp4_ct
from mtpconv.layouts import Linear, Stored, module_of
from mtpconv.plan import OutKind, OutTensor, ShardPlan


def _quantize(name: str, w: torch.Tensor, device: torch.device) -> tuple[Fp8Tensor, QuantError]:
    try:
        return quantize_fp8_checked(w.to(device))
    except NonFiniteWeightError as exc:
        raise ConversionError(
            f"{name} has {exc.count} NaN/Inf values; the source checkpoint is "
            "corrupt, so no FP8 drafter can be made from it."
        ) from None


def _source_weight(tensor: Callable[[str], torch.Tensor], lin: Linear) -> torch.Tensor:
    """The drafter weight as stored (float32 when NVFP4, dequantized exactly)."""
    if lin.stored is Stored.NVFP4:
        module = lin.module
        return dequantize_nvfp4(
            tensor(lin.weight), tensor(f"{module}.weight_scale"), tensor(f"{module}.weight_scale_2")
        )
    if lin.stored is Stored.NVFP4_CT:
        module = lin.module
        return dequantize_nvfp4_ct(
            tensor(lin.weight), tensor(f"{module}.weight_scale"), tensor(f"{module}.weight_global_scale")
        )
    return tensor(lin.weight)


def head_rows(reader: ShardReader, source: str, ids: torch.Tensor) -> torch.Tensor:
    """``head[ids]`` as stored; for an NVFP4 head only the chosen rows are dequantized."""
    if reader.info(source).dtype == "U8":
        module = module_of(source)
        return dequantize_nvfp4(
            reader.tensor(source)[ids],
            reader.tensor(f"{module}.weight_scale")[ids],
            reader.tensor(f"{module}.weight_scale_2"),
        )
    return reader.tensor(source)[ids]


# The two output tensors an FP8 quantization yields; a scale is written from the
# same result as its weight, whichever of the two the plan puts first.
_Part = Literal["weight", "scale"]
_FP8_PARTS: dict[OutKind, _Part] = {
    OutKind.FP8_WEIGHT: "weight",
    OutKind.FP8_SCALE: "scale",
    OutKind.DRAFT_HEAD: "weight",
    OutKind.DRAFT_HEAD_SCALE: "scale",
}


# A rewritten shard flows through three stages: a reader thread (source bytes, in
# file order, hashed as read), the FP8 math (this thread) and a writer thread
# (output bytes, hashed as written, one fsync). The queues hold two items each, so
# at most a handful of drafter tensors are in memory however large the shard is.
_QUEUE_DEPTH = 2
_POLL_S = 0.1


class _Aborted(Exception):
    """Another stage of the pipeline failed; this one stops."""


def _put(q: queue.Queue[Any], item: Any, failed: threading.Event) -> None:
    while True:
        try:
            q.put(item, timeout=_POLL_S)
            return
        except queue.Full:
            if failed.is_set():
                raise _Aborted from None


def _get(q: queue.Queue[Any], failed: threading.Event) -> Any:
    while True:
        try:
            return q.get(timeout=_POLL_S)
        except queue.Empty:
            if failed.is_set():
                raise _Aborted from None


_END = ("end",)


class ShardJob:
    """Rewrites planned shards: target tensors copied verbatim, drafter linears to FP8.

    Tensors are written in the plan's order. Each FP8 result is kept only until
    both its weight and its scale are written, so a scale may come before its
    weight or apart from it.
    """

    def __init__(
        self,
        reader: ShardReader,
        device: torch.device,
        advance: Callable[[int], None],
        head: tuple[str, torch.Tensor] | None = None,
    ) -> None:
        self.reader = reader
        self.device = device
        self.advance = advance
        self.head = head  # the draft head's tensor name and its rows as stored
        self.errors: dict[str, QuantError] = {}
        self._open: dict[str, tuple[Fp8Tensor, set[_Part]]] = {}
        self._loaded: set[str] = set()  # modules whose source weight the reader has sent

    def run(
        self,
        files: CheckpointFiles,
        shard: ShardPlan,
        out: Path,
        known_source: str | Callable[[], str] | None = None,
    ) -> tuple[str, str]:
        """Write ``shard`` to ``out``; return the sha256 of the file written and of the source shard.

        ``known_source``: the source shard's digest when already known, or a function that
        returns it once the shard is written (then the conversion's reads do not hash it).
        """
        # A file of the variant's own (the draft head) has no source shard to stream.
        source = files.shards.get(shard.file)
        stream = ShardStream(files.directory / shard.file, known_source) if source else None
        out.parent.mkdir(parents=True, exist_ok=True)
        writer = ShardWriter(out, [t.spec for t in shard.tensors], source.metadata if source else {})
        failed = threading.Event()
        to_math: queue.Queue[Any] = queue.Queue(_QUEUE_DEPTH)
        to_disk: queue.Queue[Any] = queue.Queue(_QUEUE_DEPTH)
        errors: list[BaseException] = []
        digests: dict[str, str] = {}

        def stage(target: Callable[[], None]) -> Callable[[], None]:
            def body() -> None:
                try:
                    target()
                except _Aborted:
                    pass
                except BaseException as exc:
                    errors.append(exc)
                    failed.set()

            return body

        def read() -> None:
            for t in shard.tensors:
                if t.kind is OutKind.COPY:  # verbatim, in chunks: never a whole target tensor
                    assert t.source is not None and stream is not None
                    info = self.reader.info(t.source)
                    _put(to_math, ("bytes", t.spec.name, info.nbytes, b"", True, None), failed)
                    for start, chunk in stream.chunks(info):
                        span = (start, start + len(chunk))
                        _put(to_math, ("bytes", t.spec.name, info.nbytes, chunk, False, span), failed)
                else:
                    _put(to_math, self._read(stream, shard.file, t), failed)
            digests["source"] = stream.finish() if stream is not None else ""
            _put(to_math, _END, failed)

        def write() -> None:
            while (item := _get(to_disk, failed)) is not _END:
                name, nbytes, data, first, span = item
                if first:
                    writer.begin(name, nbytes)
                writer.write_part(data)
                if span is not None and stream is not None:
                    stream.release(*span)  # a verbatim chunk, written: its source pages go
                self.advance(len(data))
            digests["out"] = writer.close()

        threads = [
            threading.Thread(target=stage(read), name="mtpconv-read", daemon=True),
            threading.Thread(target=stage(write), name="mtpconv-write", daemon=True),
        ]
        for th in threads:
            th.start()
        try:
            while (item := _get(to_math, failed)) is not _END:
                for part in self._compute(item):
                    _put(to_disk, part, failed)
                if item[0] == "fp8" and stream is not None:
                    for span in item[3]:  # the source weight is quantized: its pages go
                        stream.release(*span)
            if self._open:
                raise AssertionError(f"{shard.file}: plan lacks the other part of {sorted(self._open)}")
            _put(to_disk, _END, failed)
        except _Aborted:
            pass
        except BaseException:
            failed.set()
            raise
        finally:
            for th in threads:
                th.join()
            if stream is not None:
                stream.close()
            if failed.is_set() or errors:
                writer.abort()
        if errors:
            raise errors[0]
        return digests["out"], digests["source"]

    def _read(self, stream: ShardStream | None, file: str, t: OutTensor) -> tuple[Any, ...]:
        """What the math stage needs for FP8 or head tensor ``t`` (the source weight, once)."""
        if t.kind in (OutKind.FP8_WEIGHT, OutKind.FP8_SCALE):
            lin = t.linear
            assert lin is not None
            weight = None
            spans: list[tuple[int, int]] = []  # the source bytes this item reads
            if lin.module not in self._loaded:
                assert stream is not None  # drafter linears live in source shards
                self._loaded.add(lin.module)
                weight = _source_weight(lambda n: self._tensor(stream, file, n, spans), lin)
            return ("fp8", t, weight, spans)
        return ("head", t, None, [])

    def _tensor(
        self, stream: ShardStream, file: str, name: str, spans: list[tuple[int, int]]
    ) -> torch.Tensor:
        info = self.reader.info(name)
        if info.file == file:
            spans.append((info.start, info.end))
            return tensor_from_bytes(stream.read(info), info)
        return self.reader.tensor(name)  # an NVFP4 scale stored in another shard

    def _compute(self, item: tuple[Any, ...]) -> Iterator[tuple[str, int, Any, bool, tuple[int, int] | None]]:
        """The writer's items (name, nbytes, bytes, first part?, source span of a verbatim
        chunk) for one reader item."""
        if item[0] == "bytes":
            yield item[1:]
            return
        kind, t, weight, _ = item
        name = t.spec.name
        if kind == "fp8":
            lin = t.linear
            if weight is not None:  # the first of the linear's two parts
                self._start(lin.module, lambda: _quantize(lin.weight, weight, self.device))
            out = self._part(lin.module, _FP8_PARTS[t.kind])
            if t.kind is OutKind.FP8_SCALE:
                # The per-tensor value, replicated into the declared layout (DESIGN §5).
                out = stored_scale(out, lin.scale_layout, lin.shape, lin.fused_halves)
        else:
            assert self.head is not None
            head, rows = self.head
            if t.spec.dtype == "BF16":
                out = rows.to(torch.bfloat16)
            else:
                module = module_of(head)
                if module not in self._open:
                    self._start(module, lambda: _quantize(head, rows, self.device))
                out = self._part(module, _FP8_PARTS[t.kind])
        if torch_dtype(t.spec.dtype) != out.dtype:
            raise AssertionError(f"writer expected {name} as {t.spec.dtype}, got {out.dtype}")
        data = tensor_bytes(out)
        yield name, len(data), data, True, None

    def _start(self, module: str, make: Callable[[], tuple[Fp8Tensor, QuantError]]) -> None:
        fp8, error = make()
        self.errors[module] = error
        self._open[module] = (fp8, {"weight", "scale"})

    def _part(self, module: str, part: _Part) -> torch.Tensor:
        """One part of ``module``'s FP8 result; the result is dropped after its second part."""
        fp8, left = self._open[module]
        left.discard(part)
        if not left:
            del self._open[module]
        return fp8.weight if part == "weight" else fp8.scale
