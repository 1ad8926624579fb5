"""``quantize-mtp``: orchestration over the plan.

source -> headers -> layout -> plan (validated) -> shard jobs -> writer ->
configs -> manifest -> verification of what was written. The source is only
ever opened for reading; the output appears atomically.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from mtpconv.checkpoint.digests import file_digest, sha256_file
from mtpconv.checkpoint.index import INDEX_NAME, CheckpointFiles, load_checkpoint_files
from mtpconv.checkpoint.safetensors_io import read_tensor
from mtpconv.checkpoint.source import (
    Source,
    load_files,
    looks_like_repo_id,
    remote_checkpoint,
    resolve_source,
)
from mtpconv.checkpoint.writer import (
    ShardWriter,
    atomic_output_dir,
    link_or_copy,
    write_json,
)
from mtpconv.errors import ConversionError, OutputError, interruptible
from mtpconv.formats.fp8 import Fp8Tensor, NonFiniteWeightError, QuantError, quantize_fp8_checked
from mtpconv.formats.nvfp4 import dequantize_nvfp4
from mtpconv.jsonio import dumps_json, read_json
from mtpconv.layouts import Linear, MtpLayout, detect_layout, module_of
from mtpconv.manifest import (
    DRAFT_VOCAB_IDS_NAME,
    DrafterSection,
    DraftVocabSection,
    Manifest,
    read_manifest,
    write_manifest,
)
from mtpconv.plan import ConversionPlan, OutTensor, ShardPlan, build_plan, check_destination
from mtpconv.quantconfig.documents import QuantConfigs, load_quant_configs
from mtpconv.quantconfig.rewrite import variant_configs

Progress = Callable[[int], None]


@dataclass
class ConversionReport:
    """What quantize-mtp did (or, with dry_run, would do)."""

    source: str
    destination: str
    plan: ConversionPlan
    dry_run: bool
    device: str
    errors: dict[str, QuantError] = field(default_factory=dict)
    linked: int = 0
    copied: int = 0
    seconds: float = 0.0
    draft_vocab_size: int | None = None

    @property
    def max_rel_l2(self) -> float:
        return max((e.rel_l2 for e in self.errors.values()), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "destination": self.destination,
            "dry_run": self.dry_run,
            "device": self.device,
            "plan": self.plan.to_dict(),
            "tensors_converted": len(self.plan.linears),
            "bytes_saved": self.plan.bytes_before - self.plan.bytes_after,
            "max_rel_l2": self.max_rel_l2,
            "linked_files": self.linked,
            "copied_files": self.copied,
            "seconds": round(self.seconds, 3),
            "draft_vocab_size": self.draft_vocab_size,
        }


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConversionError("--device cuda was given but no CUDA device is available.")
    if device not in ("cpu", "cuda"):
        raise ConversionError(f"--device must be auto, cpu or cuda, not {device!r}.")
    return torch.device(device)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw little-endian bytes of a CPU tensor, without a copy when contiguous."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]


class _SourceReader:
    """Open source shards (read-only), one handle each, closed at the end."""

    def __init__(self, files: CheckpointFiles) -> None:
        self._files = files
        self._handles: dict[str, BinaryIO] = {}

    def handle(self, file: str) -> BinaryIO:
        if file not in self._handles:
            self._handles[file] = open(self._files.directory / file, "rb")  # noqa: SIM115
        return self._handles[file]

    def tensor(self, name: str) -> torch.Tensor:
        info = self._files.tensors[name]
        return read_tensor(self.handle(info.file), info)

    def close(self) -> None:
        for f in self._handles.values():
            f.close()


def _source_weight(reader: _SourceReader, lin: Linear) -> torch.Tensor:
    """The drafter weight as stored (float32 when NVFP4, dequantized exactly)."""
    if lin.stored == "nvfp4":
        module = lin.module
        return dequantize_nvfp4(
            reader.tensor(lin.weight),
            reader.tensor(f"{module}.weight_scale"),
            reader.tensor(f"{module}.weight_scale_2"),
        )
    return reader.tensor(lin.weight)


def _quantize(name: str, w: torch.Tensor, device: torch.device) -> tuple[Fp8Tensor, QuantError]:
    try:
        return quantize_fp8_checked(w.to(device))
    except NonFiniteWeightError as exc:
        raise ConversionError(f"{name} has {exc.count} NaN/Inf values; the source checkpoint is "
                              "corrupt, so no FP8 drafter can be made from it.") from None  # fmt: skip


class _ShardJob:
    """Rewrites one shard: target tensors copied verbatim, drafter linears to FP8."""

    def __init__(self, reader: _SourceReader, device: torch.device,
                 head_rows: torch.Tensor | None, advance: Progress) -> None:  # fmt: skip
        self.reader = reader
        self.device = device
        self.head_rows = head_rows
        self.advance = advance
        self.errors: dict[str, QuantError] = {}
        self._pending_scale: torch.Tensor | None = None

    def run(self, files: CheckpointFiles, shard: ShardPlan, out: Path) -> str:
        writer = ShardWriter(out, [t.spec for t in shard.tensors],
                             files.shards[shard.file].metadata)  # fmt: skip
        try:
            for t in shard.tensors:
                self._write(files, writer, t)
                self.advance(t.spec.nbytes)
            return writer.close()
        except BaseException:
            writer.abort()
            raise

    def _write(self, files: CheckpointFiles, writer: ShardWriter, t: OutTensor) -> None:
        name = t.spec.name
        if t.kind == "copy":
            assert t.source is not None
            info = files.tensors[t.source]
            writer.copy(name, self.reader.handle(info.file), info.start, info.nbytes)
        elif t.kind == "fp8_weight":
            assert t.linear is not None
            fp8, error = _quantize(t.linear.weight, _source_weight(self.reader, t.linear), self.device)
            self.errors[t.linear.module] = error
            writer.write(name, tensor_bytes(fp8.weight))
            self._pending_scale = fp8.scale
        elif t.kind == "fp8_scale":
            assert self._pending_scale is not None
            writer.write(name, tensor_bytes(self._pending_scale))
            self._pending_scale = None
        elif t.kind == "draft_head":
            assert self.head_rows is not None
            if t.spec.dtype == "F8_E4M3":
                fp8, error = _quantize(name, self.head_rows, self.device)
                self.errors[module_of(name)] = error
                writer.write(name, tensor_bytes(fp8.weight))
                self._pending_scale = fp8.scale
            else:
                writer.write(name, tensor_bytes(self.head_rows.to(torch.bfloat16)))
        elif t.kind == "draft_head_scale":
            assert self._pending_scale is not None
            writer.write(name, tensor_bytes(self._pending_scale))
            self._pending_scale = None
        else:  # pragma: no cover - plan kinds are closed
            raise AssertionError(t.kind)


def _head_rows(reader: _SourceReader, files: CheckpointFiles, source: str,
               ids: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``head[ids]`` as stored; for an NVFP4 head only the chosen rows are dequantized."""
    info = files.tensors[source]
    if info.dtype == "U8":
        module = module_of(source)
        return dequantize_nvfp4(reader.tensor(source)[ids],
                                reader.tensor(f"{module}.weight_scale")[ids],
                                reader.tensor(f"{module}.weight_scale_2"))  # fmt: skip
    return reader.tensor(source)[ids]


def _drafter_modules(layout: MtpLayout, plan: ConversionPlan) -> list[str]:
    mods = {module_of(n) for n in layout.drafter_tensors}
    if plan.draft_head is not None:
        mods.add(module_of(plan.draft_head.tensor))
    return sorted(mods)


def _load(source_spec: str, revision: str | None, *, headers_only: bool = False,
          ) -> tuple[Source, CheckpointFiles, QuantConfigs, MtpLayout]:  # fmt: skip
    """Resolve and validate the source; a Hub repo id with ``headers_only`` downloads no weights."""
    if headers_only and looks_like_repo_id(source_spec):
        source, files = remote_checkpoint(source_spec, revision)
    else:
        source = resolve_source(source_spec, revision)
        files = load_files(source)
    if read_manifest(source.directory) is not None:
        raise ConversionError(f"{source_spec} is already an -mtpfp8 variant (it has mtpconv.json); "
                              "convert the original checkpoint instead.")  # fmt: skip
    configs = load_quant_configs(source.directory)
    layout = detect_layout(configs.config, files.tensors)
    return source, files, configs, layout


def quantize_mtp(
    source_spec: str,
    dst: str | os.PathLike[str],
    *,
    revision: str | None = None,
    draft_vocab: str | os.PathLike[str] | None = None,
    draft_head_dtype: str = "fp8",
    device: str = "auto",
    dry_run: bool = False,
    force: bool = False,
    copy: bool = False,
    progress: Any = None,
) -> ConversionReport:
    """Write the ``-mtpfp8`` variant of ``source_spec`` to ``dst`` (DESIGN §5)."""
    started = time.monotonic()
    dev = pick_device(device)
    source, files, configs, layout = _load(source_spec, revision, headers_only=dry_run)
    ids = None
    vocab_meta: dict[str, Any] = {}
    if draft_vocab is not None:
        from mtpconv.formats.draft_ids import load_draft_vocab_ids, sidecar_path

        if layout.vocab_size is None:
            raise ConversionError("config.json has no vocab_size; cannot check the draft vocab ids.")
        ids = load_draft_vocab_ids(draft_vocab, layout.vocab_size)
        vocab_meta = _read_sidecar(sidecar_path(draft_vocab))
        if vocab_meta.get("ids_sha256") not in (None, sha256_file(draft_vocab)):
            vocab_meta = {}  # a stale sidecar from another run: its coverage is not this file's
    dst_path = Path(dst).expanduser()
    check_destination(source.directory, dst_path)
    plan = build_plan(files, layout, draft_vocab_rows=None if ids is None else int(ids.numel()),
                      draft_head_dtype=draft_head_dtype)  # fmt: skip
    all_modules = {module_of(n) for n in files.tensors} | set(_drafter_modules(layout, plan))
    new_hf_quant, new_config = variant_configs(configs, _drafter_modules(layout, plan), all_modules).documents
    report = ConversionReport(source=source_spec, destination=str(dst_path), plan=plan,
                              dry_run=dry_run, device=str(dev),
                              draft_vocab_size=None if ids is None else int(ids.numel()))  # fmt: skip
    if dry_run:
        return report
    with interruptible(dst_path), atomic_output_dir(dst_path, force=force) as tmp:
        _write_variant(tmp, source, files, configs, plan, new_hf_quant, new_config, ids,
                       draft_vocab, vocab_meta, dev, copy, report, progress)  # fmt: skip
    report.seconds = time.monotonic() - started
    return report


def _read_sidecar(path: Path) -> dict[str, Any]:
    """The ids file's sidecar (what was counted), or ``{}`` when there is none."""
    if not path.is_file():
        return {}
    doc: dict[str, Any] = read_json(path, ConversionError,
                                    remedy="run build-draft-vocab again or delete the sidecar")
    return doc


def _write_variant(
    tmp: Path, source: Source, files: CheckpointFiles, configs: QuantConfigs,
    plan: ConversionPlan, new_hf_quant: dict[str, Any] | None, new_config: dict[str, Any],
    ids: torch.Tensor | None, ids_path: str | os.PathLike[str] | None,
    vocab_meta: dict[str, Any], device: torch.device, copy: bool,
    report: ConversionReport, progress: Any,
) -> None:  # fmt: skip
    digests: dict[str, str] = {}
    source_digests: dict[str, Future[str]] = {}
    hashes: dict[str, Future[str]] = {}
    reader = _SourceReader(files)
    total = sum(s.out_bytes for s in plan.rewritten)
    if progress is not None:
        progress.start("Writing drafter shards", total)
    advance: Progress = progress.advance if progress is not None else (lambda n: None)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="mtpconv-hash") as pool:
        # Links first (instant), hashed in the background while shards are rewritten.
        for rel in [s.file for s in plan.linked] + plan.other_files:
            out = tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            if link_or_copy(source.directory / rel, out, copy=copy):
                report.linked += 1
            else:
                report.copied += 1
            hashes[rel] = pool.submit(file_digest, source.directory / rel, source.directory)
        for name in ("config.json", "hf_quant_config.json"):
            if (source.directory / name).is_file():
                source_digests[name] = pool.submit(file_digest, source.directory / name,
                                                   source.directory)  # fmt: skip
        head_rows = None
        if plan.draft_head is not None and ids is not None:
            head_rows = _head_rows(reader, files, plan.draft_head.source_tensor, ids)
        job = _ShardJob(reader, device, head_rows, advance)
        try:
            for shard in plan.rewritten:
                source_digests[shard.file] = pool.submit(file_digest, source.directory / shard.file,
                                                         source.directory)  # fmt: skip
                digests[shard.file] = job.run(files, shard, tmp / shard.file)
        finally:
            reader.close()
        report.errors = job.errors
        _wait_for_hashes(hashes, source.directory, progress)
        # The model card is the publisher's to replace (`mtpconv publish` generates one),
        # so README.md is carried along but not pinned by the manifest.
        digests.update({rel: f.result() for rel, f in hashes.items() if rel != "README.md"})
        src_files = {rel: f.result() for rel, f in source_digests.items()}

    digests["config.json"] = write_json(tmp / "config.json", dumps_json(new_config))
    if new_hf_quant is not None:
        digests["hf_quant_config.json"] = write_json(tmp / "hf_quant_config.json",
                                                     dumps_json(new_hf_quant))  # fmt: skip
    if plan.sharded:
        digests[INDEX_NAME] = write_json(tmp / INDEX_NAME, _index_text(files, plan))
    draft_section = None
    if ids is not None and ids_path is not None and plan.draft_head is not None:
        ids_out = tmp / DRAFT_VOCAB_IDS_NAME
        # The source may ship its own ids file, hard-linked above: replace the link, never
        # write through it.
        ids_out.unlink(missing_ok=True)
        link_or_copy(Path(ids_path), ids_out, copy=True)
        digests[DRAFT_VOCAB_IDS_NAME] = sha256_file(tmp / DRAFT_VOCAB_IDS_NAME)
        draft_section = DraftVocabSection(
            size=int(ids.numel()), file=DRAFT_VOCAB_IDS_NAME,
            sha256=digests[DRAFT_VOCAB_IDS_NAME], head_tensor=plan.draft_head.tensor,
            head_dtype=plan.draft_head.dtype, coverage=vocab_meta.get("coverage"),
            corpus=vocab_meta.get("corpus"),
        )  # fmt: skip
    manifest = Manifest(
        source={**source.describe(), "files": src_files},
        family=plan.layout.family,
        drafter=DrafterSection(prefix=plan.layout.drafter_prefixes[0],
                               fp8_linears=[lin.module for lin in plan.linears]),  # fmt: skip
        draft_vocab=draft_section,
        quantization_error={k: {"rel_l2": v.rel_l2, "max_abs": v.max_abs, "amax": v.amax}
                            for k, v in report.errors.items()},  # fmt: skip
        files=dict(sorted(digests.items())),
    )
    write_manifest(tmp, manifest)
    verify_output(tmp, plan)


def _wait_for_hashes(hashes: dict[str, Future[str]], root: Path, progress: Any) -> None:
    """Show the background hashing of untouched files, when any is still running."""
    pending = {f: rel for rel, f in hashes.items() if not f.done()}
    if not pending or progress is None:
        return
    sizes = {f: (root / rel).stat().st_size for f, rel in pending.items()}
    progress.start("Hashing untouched files for the manifest", sum(sizes.values()))
    for future in as_completed(pending):
        progress.advance(sizes[future])


def _index_text(files: CheckpointFiles, plan: ConversionPlan) -> str:
    weight_map: dict[str, str] = {}
    total = 0
    for shard in plan.shards:
        if shard.action == "link":
            for name, info in files.shards[shard.file].tensors.items():
                if files.weight_map.get(name) == shard.file:
                    weight_map[name] = shard.file
                    total += info.nbytes
        else:
            for t in shard.tensors:
                weight_map[t.spec.name] = shard.file
                total += t.spec.nbytes
    meta = dict(files.index_metadata)
    meta["total_size"] = total
    return dumps_json({"metadata": meta, "weight_map": dict(sorted(weight_map.items()))})


def verify_output(directory: Path, plan: ConversionPlan) -> None:
    """Reopen what was written: every planned tensor exactly once, index exact."""
    out = load_checkpoint_files(directory)
    expected: set[str] = set()
    for shard in plan.shards:
        if shard.action == "rewrite":
            expected.update(t.spec.name for t in shard.tensors)
    for shard in plan.linked:
        expected.update(out.shards[shard.file].tensors)
    in_shards = [n for h in out.shards.values() for n in h.tensors]
    problems = []
    if len(in_shards) != len(set(in_shards)):
        problems.append("a tensor is stored in more than one shard")
    if set(in_shards) != expected or set(out.weight_map) != expected:
        missing = sorted(expected - set(out.weight_map))[:3]
        extra = sorted(set(out.weight_map) - expected)[:3]
        problems.append(f"tensors missing {missing} / unexpected {extra}")
    if out.index_file is not None:
        total = out.index_metadata.get("total_size")
        if total != out.total_tensor_bytes:
            problems.append(f"index total_size {total} != {out.total_tensor_bytes}")
    if problems:
        raise OutputError(f"the written variant failed verification ({'; '.join(problems)}); "
                          "nothing was left at the destination.")  # fmt: skip
