"""Rewriting one planned shard: a reader thread, the FP8 math, a writer thread.

The source shard is read front to back (the plan orders its tensors by offset)
and hashed by those same reads; drafter linears are quantized to FP8 in the
calling thread; the output is hashed as it is written and fsynced once. Bounded
queues between the stages keep a few tensors in memory, however large the shard.

A 16-bit drafter on the CPU is quantized from views of the source shard by the
numpy table (:mod:`mtpconv.formats.fp8_table`), so such a conversion never imports
torch; NVFP4 sources, a CUDA device and the draft head go through torch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from mtpconv.checkpoint.index import CheckpointFiles
from mtpconv.checkpoint.reader import ShardReader, ShardStream
from mtpconv.checkpoint.safetensors_io import BF16, F8_E4M3, F32, U8, TensorInfo, tensor_from_bytes
from mtpconv.checkpoint.writer import ShardWriter, tensor_bytes
from mtpconv.errors import ConversionError
from mtpconv.formats.fp8_table import (
    HALF_DTYPES,
    NonFiniteWeightError,
    QuantError,
    quantize_table,
    replicate_scale,
)
from mtpconv.layouts import Linear, Stored, module_of
from mtpconv.plan import OutKind, OutTensor, ShardPlan

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Fp8Bytes:
    """An FP8 result as the writer takes it: e4m3 bytes and the float32 scale (0-d or [E])."""

    weight: np.ndarray
    scale: np.ndarray


@dataclass(frozen=True)
class HalfCodes:
    """A 16-bit source weight as its bit patterns (a view of the source shard): the
    table path quantizes it with numpy alone, so a CPU conversion needs no torch."""

    codes: np.ndarray
    dtype: str  # "BF16" or "F16"


def _non_finite(name: str, exc: NonFiniteWeightError) -> ConversionError:
    return ConversionError(
        f"{name} has {exc.count} NaN/Inf values; the source checkpoint is "
        "corrupt, so no FP8 drafter can be made from it."
    )


def _quantize(name: str, w: HalfCodes | torch.Tensor, device: str) -> tuple[Fp8Bytes, QuantError]:
    """FP8 of one weight: 16-bit patterns by the numpy table, anything else through torch
    on ``device`` (NVFP4 dequantized to float32, a CUDA conversion, the draft head)."""
    try:
        if isinstance(w, HalfCodes):
            q, scale, error = quantize_table(w.codes, w.dtype)
            return Fp8Bytes(q, scale), error
        import torch

        from mtpconv.formats.fp8 import quantize_fp8_checked

        fp8, error = quantize_fp8_checked(w.to(device))
        weight = fp8.weight.view(torch.uint8).cpu().numpy()
        return Fp8Bytes(weight, fp8.scale.to(torch.float32).cpu().numpy()), error
    except NonFiniteWeightError as exc:
        raise _non_finite(name, exc) from None


def _array_bytes(a: np.ndarray) -> memoryview:
    """The bytes of ``a`` in C order, without a copy when it is contiguous."""
    return memoryview(np.ascontiguousarray(a)).cast("B")  # type: ignore[arg-type]


def _uses_table(info: TensorInfo, device: str) -> bool:
    """Whether a plain source weight takes the numpy table path (16-bit, on the CPU)."""
    return device == "cpu" and info.dtype in HALF_DTYPES and len(info.shape) in (2, 3)


def _source_weight(tensor: Callable[[str], torch.Tensor], lin: Linear) -> torch.Tensor:
    """The drafter weight as stored (float32 when NVFP4, dequantized exactly)."""
    from mtpconv.formats.nvfp4 import dequantize_nvfp4, dequantize_nvfp4_ct

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
    if reader.info(source).dtype == U8:
        from mtpconv.formats.nvfp4 import dequantize_nvfp4

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
# The safetensors dtype each part is written as.
_PART_DTYPES: dict[_Part, str] = {"weight": F8_E4M3, "scale": F32}


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
        device: str,
        advance: Callable[[int], None],
        head: tuple[str, torch.Tensor] | None = None,
    ) -> None:
        self.reader = reader
        self.device = device  # "cpu", or a torch device name such as "cuda"
        self.advance = advance
        self.head = head  # the draft head's tensor name and its rows as stored
        self.errors: dict[str, QuantError] = {}
        self._open: dict[str, tuple[Fp8Bytes, set[_Part]]] = {}
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
            weight: HalfCodes | torch.Tensor | None = None
            spans: list[tuple[int, int]] = []  # the source bytes this item reads
            if lin.module not in self._loaded:
                assert stream is not None  # drafter linears live in source shards
                self._loaded.add(lin.module)
                info = self.reader.info(lin.weight)
                if lin.stored is Stored.PLAIN and info.file == file and _uses_table(info, self.device):
                    spans.append((info.start, info.end))
                    codes = np.frombuffer(stream.read(info), dtype=np.uint16).reshape(info.shape)
                    weight = HalfCodes(codes, info.dtype)
                else:
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
            part = _FP8_PARTS[t.kind]
            out = self._part(lin.module, part)
            if t.kind is OutKind.FP8_SCALE:
                # The per-tensor value, replicated into the declared layout (DESIGN §5).
                out = replicate_scale(out, lin.scale_layout, lin.shape, lin.fused_halves)
            data, dtype = _array_bytes(out), _PART_DTYPES[part]
        else:
            assert self.head is not None
            head, rows = self.head
            if t.spec.dtype == BF16:
                import torch

                data, dtype = tensor_bytes(rows.to(torch.bfloat16)), BF16
            else:
                module = module_of(head)
                if module not in self._open:
                    self._start(module, lambda: _quantize(head, rows, self.device))
                part = _FP8_PARTS[t.kind]
                data = _array_bytes(self._part(module, part))
                dtype = _PART_DTYPES[part]
        if dtype != t.spec.dtype:
            raise AssertionError(f"writer expected {name} as {t.spec.dtype}, got {dtype}")
        yield name, len(data), data, True, None

    def _start(self, module: str, make: Callable[[], tuple[Fp8Bytes, QuantError]]) -> None:
        fp8, error = make()
        self.errors[module] = error
        self._open[module] = (fp8, {"weight", "scale"})

    def _part(self, module: str, part: _Part) -> np.ndarray:
        """One part of ``module``'s FP8 result; the result is dropped after its second part."""
        fp8, left = self._open[module]
        left.discard(part)
        if not left:
            del self._open[module]
        return fp8.weight if part == "weight" else fp8.scale
