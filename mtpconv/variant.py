"""Writing a planned ``-mtpfp8`` variant into a (temporary) directory.

Untouched files are linked first and hashed in the background while shard jobs
rewrite the planned shards (drafter linears to FP8, the draft head); then the
index, both configs, the draft-vocab ids and the manifest are written, and the
result is reopened and checked against the plan. The source is only read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from mtpconv.checkpoint.digests import file_digest, sha256_file
from mtpconv.checkpoint.index import INDEX_NAME, CheckpointFiles, load_checkpoint_files
from mtpconv.checkpoint.reader import ShardReader
from mtpconv.checkpoint.source import Source
from mtpconv.checkpoint.writer import IndexWriter, ShardWriter, link_or_copy, write_json
from mtpconv.errors import ConversionError, OutputError
from mtpconv.formats.fp8 import (
    Fp8Tensor,
    NonFiniteWeightError,
    QuantError,
    quantize_fp8_checked,
    stored_scale,
)
from mtpconv.formats.nvfp4 import dequantize_nvfp4, dequantize_nvfp4_ct
from mtpconv.jsonio import dumps_json
from mtpconv.layouts import Linear, Stored, module_of
from mtpconv.manifest import (
    DRAFT_HEAD_FILE,
    DRAFT_VOCAB_IDS_NAME,
    DrafterSection,
    DraftVocabSection,
    Manifest,
    write_manifest,
)
from mtpconv.plan import ConversionPlan, OutKind, OutTensor, ShardAction, ShardPlan
from mtpconv.quantconfig.standard import DrafterDeclaration


class Progress(Protocol):
    """Where byte progress goes (the CLI passes a progress bar)."""

    def start(self, description: str, total: int) -> None: ...

    def advance(self, n: int) -> None: ...


@dataclass(frozen=True, kw_only=True)
class VariantInputs:
    """Everything :func:`write_variant` needs, decided before anything is written."""

    source: Source
    files: CheckpointFiles
    plan: ConversionPlan
    config: dict[str, Any]  # the variant's config.json
    hf_quant_config: dict[str, Any] | None  # the variant's hf_quant_config.json (None: no such file)
    declaration: DrafterDeclaration | None = None  # how those configs declare the drafter
    device: torch.device
    copy: bool = False  # copy untouched files instead of hard-linking them
    draft_ids: torch.Tensor | None = None  # the draft vocab's token ids, when there is one
    draft_ids_file: Path | None = None  # the ids file they were read from
    vocab_meta: Mapping[str, Any] = field(default_factory=dict)  # the ids file's sidecar
    draft_window: int | None = None  # the drafter's attention window, checked by the caller
    progress: Progress | None = None


@dataclass(frozen=True)
class WrittenVariant:
    """What :func:`write_variant` wrote."""

    manifest: Manifest
    errors: dict[str, QuantError]  # per FP8 module: how far FP8 is from the source
    linked: int  # untouched files hard-linked
    copied: int  # untouched files copied (linking impossible, or --copy)


def _quantize(name: str, w: torch.Tensor, device: torch.device) -> tuple[Fp8Tensor, QuantError]:
    try:
        return quantize_fp8_checked(w.to(device))
    except NonFiniteWeightError as exc:
        raise ConversionError(
            f"{name} has {exc.count} NaN/Inf values; the source checkpoint is "
            "corrupt, so no FP8 drafter can be made from it."
        ) from None


def _source_weight(reader: ShardReader, lin: Linear) -> torch.Tensor:
    """The drafter weight as stored (float32 when NVFP4, dequantized exactly)."""
    if lin.stored is Stored.NVFP4:
        module = lin.module
        return dequantize_nvfp4(
            reader.tensor(lin.weight),
            reader.tensor(f"{module}.weight_scale"),
            reader.tensor(f"{module}.weight_scale_2"),
        )
    if lin.stored is Stored.NVFP4_CT:
        return dequantize_nvfp4_ct(
            reader.tensor(lin.weight),
            reader.tensor(f"{lin.module}.weight_scale"),
            reader.tensor(f"{lin.module}.weight_global_scale"),
        )
    return reader.tensor(lin.weight)


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

    def run(self, files: CheckpointFiles, shard: ShardPlan, out: Path) -> str:
        """Write ``shard`` to ``out``; return the file's sha256."""
        source = files.shards.get(shard.file)
        out.parent.mkdir(parents=True, exist_ok=True)
        writer = ShardWriter(out, [t.spec for t in shard.tensors], source.metadata if source else {})
        try:
            for t in shard.tensors:
                self._write(writer, t)
                self.advance(t.spec.nbytes)
            if self._open:
                raise AssertionError(f"{shard.file}: plan lacks the other part of {sorted(self._open)}")
            return writer.close()
        except BaseException:
            writer.abort()
            raise

    def _write(self, writer: ShardWriter, t: OutTensor) -> None:
        name = t.spec.name
        if t.kind is OutKind.COPY:
            assert t.source is not None
            info = self.reader.info(t.source)
            writer.copy(name, self.reader.handle(t.source), info.start, info.nbytes)
        elif t.kind in (OutKind.FP8_WEIGHT, OutKind.FP8_SCALE):
            lin = t.linear
            assert lin is not None
            part = self._part(
                lin.module,
                _FP8_PARTS[t.kind],
                lambda: _quantize(lin.weight, _source_weight(self.reader, lin), self.device),
            )
            if t.kind is OutKind.FP8_SCALE:
                # The per-tensor value, replicated into the declared layout (DESIGN §5).
                part = stored_scale(part, lin.scale_layout, lin.shape, lin.fused_halves)
            writer.write_tensor(name, part)
        elif t.kind in (OutKind.DRAFT_HEAD, OutKind.DRAFT_HEAD_SCALE):
            assert self.head is not None
            head, rows = self.head
            if t.spec.dtype == "BF16":
                writer.write_tensor(name, rows.to(torch.bfloat16))
                return
            part = self._part(module_of(head), _FP8_PARTS[t.kind], lambda: _quantize(head, rows, self.device))
            writer.write_tensor(name, part)
        else:  # pragma: no cover - OutKind is closed
            raise AssertionError(t.kind)

    def _part(
        self, module: str, part: _Part, make: Callable[[], tuple[Fp8Tensor, QuantError]]
    ) -> torch.Tensor:
        """One part of ``module``'s FP8 result, quantizing on the first of its two parts."""
        if module not in self._open:
            fp8, error = make()
            self.errors[module] = error
            self._open[module] = (fp8, {"weight", "scale"})
        fp8, left = self._open[module]
        left.discard(part)
        if not left:
            del self._open[module]
        return fp8.weight if part == "weight" else fp8.scale


def write_variant(directory: Path, inputs: VariantInputs) -> WrittenVariant:
    """Write the planned variant into ``directory`` and verify it; return what was written."""
    plan, source = inputs.plan, inputs.source
    weights = _write_weights(directory, inputs)
    digests = dict(weights.digests)
    digests["config.json"] = write_json(directory / "config.json", dumps_json(inputs.config))
    if inputs.hf_quant_config is not None:
        digests["hf_quant_config.json"] = write_json(
            directory / "hf_quant_config.json", dumps_json(inputs.hf_quant_config)
        )
    if plan.sharded:
        digests[INDEX_NAME] = weights.index.write(directory)
    draft_section = _write_draft_ids(directory, inputs, digests)
    manifest = Manifest(
        source={**source.describe(), "files": weights.source_digests},
        family=plan.layout.family,
        drafter=DrafterSection(
            prefix=plan.layout.drafter_prefixes[0],
            fp8_linears=[lin.module for lin in plan.linears],
            scale_layouts={lin.module: lin.scale_layout.value for lin in plan.linears},
            declaration=inputs.declaration.style.value if inputs.declaration else "exclusion",
            declared_algorithms=dict(inputs.declaration.algos) if inputs.declaration else {},
            kept_bf16=dict(plan.layout.kept_bf16),
        ),
        draft_vocab=draft_section,
        quantization_error={
            k: {"rel_l2": v.rel_l2, "max_abs": v.max_abs, "amax": v.amax} for k, v in weights.errors.items()
        },
        files=dict(sorted(digests.items())),
        draft_window=inputs.draft_window,
    )
    write_manifest(directory, manifest)
    verify_output(directory, plan)
    return WrittenVariant(
        manifest=manifest, errors=weights.errors, linked=weights.linked, copied=weights.copied
    )


@dataclass
class _Weights:
    """What the weight step wrote: digests of the variant's and the source's files."""

    digests: dict[str, str]
    source_digests: dict[str, str]
    index: IndexWriter
    errors: dict[str, QuantError]
    linked: int = 0
    copied: int = 0


def _write_weights(directory: Path, inputs: VariantInputs) -> _Weights:
    """Link untouched files (hashed in the background) and rewrite the planned shards."""
    plan, files, root = inputs.plan, inputs.files, inputs.source.directory
    progress = inputs.progress
    out = _Weights({}, {}, IndexWriter(files.index_metadata), {})
    source_digests: dict[str, Future[str]] = {}
    hashes: dict[str, Future[str]] = {}
    if progress is not None:
        progress.start("Writing drafter shards", sum(s.out_bytes for s in plan.rewritten))
    advance = progress.advance if progress is not None else (lambda n: None)
    with (
        ThreadPoolExecutor(max_workers=2, thread_name_prefix="mtpconv-hash") as pool,
        ShardReader(files) as reader,
    ):
        # Links first (instant), hashed in the background while shards are rewritten.
        for rel in [s.file for s in plan.linked] + plan.other_files:
            dst = directory / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if link_or_copy(root / rel, dst, copy=inputs.copy):
                out.linked += 1
            else:
                out.copied += 1
            hashes[rel] = pool.submit(file_digest, root / rel, root)
        for name in ("config.json", "hf_quant_config.json"):
            if (root / name).is_file():
                source_digests[name] = pool.submit(file_digest, root / name, root)
        head = None
        if plan.draft_head is not None and inputs.draft_ids is not None:
            rows = head_rows(reader, plan.draft_head.source_tensor, inputs.draft_ids)
            head = (plan.draft_head.tensor, rows)
        job = ShardJob(reader, inputs.device, advance, head)
        for shard in plan.shards:
            if shard.action is ShardAction.LINK:
                linked = files.shard_tensors(shard.file)
                out.index.add(shard.file, ((n, t.nbytes) for n, t in linked.items()))
                continue
            if shard.indexed:
                source_digests[shard.file] = pool.submit(file_digest, root / shard.file, root)
            out.digests[shard.file] = job.run(files, shard, directory / shard.file)
            if shard.indexed:
                out.index.add(shard.file, ((t.spec.name, t.spec.nbytes) for t in shard.tensors))
        out.errors = job.errors
        _wait_for_hashes(hashes, root, progress)
        # The model card is the publisher's to replace (`mtpconv publish` generates one),
        # so README.md is carried along but not pinned by the manifest.
        out.digests.update({rel: f.result() for rel, f in hashes.items() if rel != "README.md"})
        out.source_digests = {rel: f.result() for rel, f in source_digests.items()}
    return out


def _write_draft_ids(
    directory: Path, inputs: VariantInputs, digests: dict[str, str]
) -> DraftVocabSection | None:
    """Copy the draft-vocab ids file into the variant; its manifest section (None: no draft head)."""
    head, ids, ids_file = inputs.plan.draft_head, inputs.draft_ids, inputs.draft_ids_file
    if ids is None or ids_file is None or head is None:
        return None
    ids_out = directory / DRAFT_VOCAB_IDS_NAME
    # The source may ship its own ids file, hard-linked above: replace the link, never
    # write through it.
    ids_out.unlink(missing_ok=True)
    link_or_copy(ids_file, ids_out, copy=True)
    digests[DRAFT_VOCAB_IDS_NAME] = sha256_file(ids_out)
    return DraftVocabSection(
        size=int(ids.numel()),
        file=DRAFT_VOCAB_IDS_NAME,
        sha256=digests[DRAFT_VOCAB_IDS_NAME],
        head_tensor=head.tensor,
        head_dtype=head.dtype.value,
        head_file=DRAFT_HEAD_FILE,
        coverage=inputs.vocab_meta.get("coverage"),
        corpus=inputs.vocab_meta.get("corpus"),
    )


def _wait_for_hashes(hashes: dict[str, Future[str]], root: Path, progress: Progress | None) -> None:
    """Show the background hashing of untouched files, when any is still running."""
    pending = {f: rel for rel, f in hashes.items() if not f.done()}
    if not pending or progress is None:
        return
    sizes = {f: (root / rel).stat().st_size for f, rel in pending.items()}
    progress.start("Hashing untouched files for the manifest", sum(sizes.values()))
    for future in as_completed(pending):
        progress.advance(sizes[future])


def verify_output(directory: Path, plan: ConversionPlan) -> None:
    """Reopen what was written: every planned tensor exactly once, index exact."""
    out = load_checkpoint_files(directory)
    expected: set[str] = set()
    for shard in plan.weight_shards:
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
    for shard in plan.rewritten:
        if not shard.indexed and not (directory / shard.file).is_file():
            problems.append(f"{shard.file} is missing")
    if problems:
        raise OutputError(
            f"the written variant failed verification ({'; '.join(problems)}); "
            "nothing was left at the destination."
        )
