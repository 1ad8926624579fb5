"""Writing a planned ``-mtpfp8`` variant into a (temporary) directory.

Untouched files are linked first (their digest recorded only where it is already
known), then shard jobs (:mod:`mtpconv.shard_rewrite`) rewrite the planned
shards (drafter linears to FP8, the draft head); then the index, both configs,
the draft-vocab ids and the manifest are written, and the result is reopened and
checked against the plan. The source is only read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtpconv.checkpoint.digests import HashAhead, known_lfs_digest, sha256_file
from mtpconv.checkpoint.index import INDEX_NAME, CheckpointFiles, load_checkpoint_files
from mtpconv.checkpoint.reader import ShardReader
from mtpconv.checkpoint.source import Source
from mtpconv.checkpoint.writer import IndexWriter, link_or_copy, write_json
from mtpconv.errors import OutputError
from mtpconv.formats.fp8_table import QuantError
from mtpconv.jsonio import dumps_json
from mtpconv.manifest import (
    DRAFT_HEAD_FILE,
    DRAFT_VOCAB_IDS_NAME,
    DrafterSection,
    DraftVocabSection,
    FileStamp,
    Manifest,
    write_manifest,
)
from mtpconv.plan import ConversionPlan, ShardAction
from mtpconv.progress import ProgressCallback
from mtpconv.quantconfig.standard import DrafterDeclaration
from mtpconv.shard_rewrite import ShardJob, head_rows

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class VariantInputs:
    """Everything :func:`write_variant` needs, decided before anything is written."""

    source: Source
    files: CheckpointFiles
    plan: ConversionPlan
    config: dict[str, Any]  # the variant's config.json
    hf_quant_config: dict[str, Any] | None  # the variant's hf_quant_config.json (None: no such file)
    declaration: DrafterDeclaration | None = None  # how those configs declare the drafter
    device: str  # "cpu", or a torch device name such as "cuda"
    copy: bool = False  # copy untouched files instead of hard-linking them
    draft_ids: torch.Tensor | None = None  # the draft vocab's token ids, when there is one
    draft_ids_file: Path | None = None  # the ids file they were read from
    vocab_meta: Mapping[str, Any] = field(default_factory=dict)  # the ids file's sidecar
    draft_window: int | None = None  # the drafter's attention window, checked by the caller
    progress: ProgressCallback | None = None
    # digests of source shards being computed ahead of their rewrite (quantize-mtp starts it)
    source_hashes: HashAhead | None = None


@dataclass(frozen=True)
class WrittenVariant:
    """What :func:`write_variant` wrote."""

    manifest: Manifest
    errors: dict[str, QuantError]  # per FP8 module: how far FP8 is from the source
    linked: int  # untouched files hard-linked
    copied: int  # untouched files copied (linking impossible, or --copy)


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
    unhashed = {rel: st for rel, st in weights.unhashed.items() if rel not in digests}
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
        unhashed=dict(sorted(unhashed.items())),
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
    unhashed: dict[str, FileStamp] = field(default_factory=dict)
    linked: int = 0
    copied: int = 0


def _write_weights(directory: Path, inputs: VariantInputs) -> _Weights:
    """Link untouched files and rewrite the planned shards.

    Only what is read or written is hashed: a rewritten shard as it is written (and
    its source as it is read), never a linked file. A linked file's digest is
    recorded when huggingface_hub already knows it, otherwise its size and mtime
    (``mtpconv verify`` and ``publish`` check it).
    """
    plan, files, root = inputs.plan, inputs.files, inputs.source.directory
    progress = inputs.progress
    out = _Weights({}, {}, IndexWriter(files.index_metadata), {})
    if progress is not None:
        progress.start("Writing drafter shards", sum(s.out_bytes for s in plan.rewritten))
    advance = progress.advance if progress is not None else (lambda n: None)
    with ShardReader(files) as reader:
        for rel in [s.file for s in plan.linked] + plan.other_files:
            dst = directory / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if link_or_copy(root / rel, dst, copy=inputs.copy):
                out.linked += 1
            else:
                out.copied += 1
            # The model card is the publisher's to replace (`mtpconv publish` generates
            # one), so README.md is carried along but not pinned by the manifest.
            if rel == "README.md":
                continue
            known = known_lfs_digest(root / rel, root)
            if known is not None:
                out.digests[rel] = known
            else:
                out.unhashed[rel] = FileStamp.of(dst)
        for name in ("config.json", "hf_quant_config.json"):
            if (root / name).is_file():  # read for the plan: small, hashed here
                out.source_digests[name] = known_lfs_digest(root / name, root) or sha256_file(root / name)
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
            source_digest: str | Callable[[], str] | None = None
            if shard.indexed:
                # quantize-mtp hashes ahead exactly the shards whose digest nobody recorded
                ahead, path = inputs.source_hashes, root / shard.file
                if ahead is not None and path in ahead:
                    source_digest = functools.partial(ahead.digest, path)
                else:
                    source_digest = known_lfs_digest(path, root)
            written, read = job.run(files, shard, directory / shard.file, source_digest)
            out.digests[shard.file] = written
            if shard.indexed:
                out.source_digests[shard.file] = read
                out.index.add(shard.file, ((t.spec.name, t.spec.nbytes) for t in shard.tensors))
        out.errors = job.errors
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
