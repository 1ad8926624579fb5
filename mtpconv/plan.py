"""The conversion plan, built from headers only and validated before any write.

It says, shard by shard, what is hard-linked and what is rewritten, which
drafter linears become FP8, which NVFP4 scale tensors disappear, where the
draft head goes, and how many bytes change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from mtpconv.checkpoint.index import INDEX_NAME, CheckpointFiles
from mtpconv.checkpoint.safetensors_io import BF16, F8_E4M3, F32, U8
from mtpconv.checkpoint.writer import TensorSpec
from mtpconv.conversion_options import HeadDtype
from mtpconv.errors import ConversionError, LayoutError, OutputError, SourceError
from mtpconv.families import FAMILIES
from mtpconv.families import family as family_row
from mtpconv.formats.scale_layout import stored_scale_shape
from mtpconv.layouts import Linear, MtpLayout, Stored
from mtpconv.manifest import DRAFT_HEAD_FILE, DRAFT_HEAD_NAME, MANIFEST_NAME

# Files we write ourselves; everything else of the source is linked or copied.
OWN_FILES = frozenset({"config.json", "hf_quant_config.json", INDEX_NAME, MANIFEST_NAME})


class OutKind(str, Enum):
    """How one tensor of a rewritten shard is produced."""

    COPY = "copy"  # the source tensor's bytes, verbatim
    FP8_WEIGHT = "fp8_weight"  # a drafter linear quantized to FP8
    FP8_SCALE = "fp8_scale"  # that linear's float32 scale
    DRAFT_HEAD = "draft_head"  # the head rows of the draft vocab (FP8 or BF16)
    DRAFT_HEAD_SCALE = "draft_head_scale"  # the FP8 draft head's scale

    def __str__(self) -> str:
        return self.value


class ShardAction(str, Enum):
    """What happens to one source shard."""

    LINK = "link"  # hard-linked (or copied) unchanged
    REWRITE = "rewrite"  # written anew from the plan's tensors

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class OutTensor:
    """One tensor of a rewritten shard: copied verbatim, or produced by a step.

    The tensors of a shard are written in the plan's order; a scale need not
    follow its weight (the writer looks each part up by its linear).
    """

    spec: TensorSpec
    kind: OutKind
    source: str | None = None  # source tensor name for OutKind.COPY
    linear: Linear | None = None  # the drafter linear for FP8_WEIGHT / FP8_SCALE


@dataclass
class ShardPlan:
    """One source shard: linked as it is, or rewritten tensor by tensor."""

    file: str
    action: ShardAction
    tensors: list[OutTensor] = field(default_factory=list)
    # False for the draft-head file: outside the index and the root glob, so stock
    # vLLM never loads it (the plugin does, from mtpconv.json).
    indexed: bool = True

    @property
    def out_bytes(self) -> int:
        return sum(t.spec.nbytes for t in self.tensors)


@dataclass(frozen=True)
class DraftHeadPlan:
    """The draft head: ``rows`` rows of the source head, stored as ``dtype``."""

    rows: int
    hidden: int
    dtype: HeadDtype
    source_tensor: str
    tensor: str  # output weight name


@dataclass
class ConversionPlan:
    """Every output tensor and file of a variant, decided from headers."""

    source_dir: Path
    layout: MtpLayout
    shards: list[ShardPlan]
    linears: list[Linear]
    dropped: list[str]  # NVFP4 scale tensors that the FP8 weight replaces
    other_files: list[str]  # non-weight files linked/copied as they are
    bytes_before: int
    bytes_after: int
    draft_head: DraftHeadPlan | None = None
    sharded: bool = True

    @property
    def rewritten(self) -> list[ShardPlan]:
        return [s for s in self.shards if s.action is ShardAction.REWRITE]

    @property
    def weight_shards(self) -> list[ShardPlan]:
        """Rewritten shards of the source (in the index), without the draft-head file."""
        return [s for s in self.rewritten if s.indexed]

    @property
    def linked(self) -> list[ShardPlan]:
        return [s for s in self.shards if s.action is ShardAction.LINK]

    def to_dict(self) -> dict[str, object]:
        return {
            "family": self.layout.family,
            "fp8_linears": [lin.module for lin in self.linears],
            "dropped_tensors": self.dropped,
            "rewritten_shards": [s.file for s in self.rewritten],
            "linked_shards": [s.file for s in self.linked],
            "other_files": self.other_files,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "kept_bf16": dict(self.layout.kept_bf16),
            "draft_head": None
            if self.draft_head is None
            else {
                "tensor": self.draft_head.tensor,
                "file": DRAFT_HEAD_FILE,
                "rows": self.draft_head.rows,
                "dtype": self.draft_head.dtype.value,
                "source_tensor": self.draft_head.source_tensor,
            },
        }


def check_destination(source_dir: Path, dst: Path) -> None:
    """Refuse a destination equal to, or inside, the source (or the reverse)."""
    src = Path(os.path.realpath(source_dir))
    out = Path(os.path.realpath(dst))
    if out == src or src in out.parents:
        raise OutputError(
            f"destination {dst} is inside the source {source_dir}; choose a "
            "directory outside the source checkpoint."
        )
    if out in src.parents:
        raise OutputError(f"destination {dst} contains the source {source_dir}; choose another directory.")


def draft_head_name(layout: MtpLayout) -> str:
    row = family_row(layout.family)
    if row is None or not row.draft_vocab:
        served = ", ".join(r.name for r in FAMILIES if r.draft_vocab)
        raise ConversionError(
            f"the plugin serves a truncated draft head for the drafters of {served}; "
            f"this checkpoint is {layout.family}. Convert it without a draft vocabulary."
        )
    return f"{layout.drafter_prefixes[0]}{DRAFT_HEAD_NAME.split('.', 1)[1]}.weight"


def other_files(source_dir: Path, files: CheckpointFiles) -> list[str]:
    shards = set(files.shards)
    out = []
    for root, dirs, names in os.walk(source_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(root, name), source_dir)
            if rel in shards or rel in OWN_FILES or name.startswith("."):
                continue
            if not os.path.isfile(os.path.join(root, name)):
                # A FIFO would block the hashing thread forever (not even SIGTERM ends it).
                raise SourceError(
                    f"{rel} in {source_dir} is not a regular file (a FIFO, "
                    "socket, device or broken link); move it out of the "
                    "checkpoint."
                )
            out.append(rel)
    return out


def build_plan(
    files: CheckpointFiles,
    layout: MtpLayout,
    *,
    draft_vocab_rows: int | None = None,
    draft_head_dtype: HeadDtype = HeadDtype.FP8,
) -> ConversionPlan:
    """Decide every output tensor from headers; raise before anything is written.

    Each FP8 scale is stored in its linear's ``scale_layout`` (DESIGN §5).
    """
    if not layout.has_drafter:
        raise LayoutError(
            f"{files.directory} has no MTP drafter tensors ({layout.family}); there is nothing "
            "to convert. Run `mtpconv inspect` to see what the checkpoint holds."
        )
    if not layout.linears:
        raise LayoutError(f"the {layout.family} drafter of {files.directory} has no linear layers.")
    already = [lin.module for lin in layout.linears if lin.stored is Stored.FP8]
    if already:
        raise ConversionError(
            f"{files.directory} already has an FP8 drafter ({already[0]} is FP8): it looks like an "
            "-mtpfp8 variant. Convert the original checkpoint instead."
        )
    by_weight = {lin.weight: lin for lin in layout.linears}
    dropped = [name for lin in layout.linears for name in lin.aux]
    dropped_set = set(dropped)
    head_plan = None
    if draft_vocab_rows is not None:
        head_plan = _draft_head_plan(files, layout, draft_vocab_rows, draft_head_dtype)
    shards: list[ShardPlan] = []
    for file, header in files.shards.items():
        names = [n for n in header.tensors if files.weight_map.get(n) == file]
        touched = any(n in by_weight or n in dropped_set for n in names)
        if not touched:
            shards.append(ShardPlan(file, ShardAction.LINK))
            continue
        plan = ShardPlan(file, ShardAction.REWRITE)
        for name in sorted(names, key=lambda n: header.tensors[n].start):
            info = header.tensors[name]
            if name in dropped_set:
                continue
            lin = by_weight.get(name)
            if lin is None:
                plan.tensors.append(
                    OutTensor(TensorSpec(name, info.dtype, info.shape), OutKind.COPY, source=name)
                )
                continue
            _check_shape(lin)
            plan.tensors.append(
                OutTensor(TensorSpec(lin.fp8_weight_name, F8_E4M3, lin.shape), OutKind.FP8_WEIGHT, linear=lin)
            )
            scale_shape = stored_scale_shape(lin.scale_layout, lin.shape, lin.fused_halves)
            plan.tensors.append(
                OutTensor(TensorSpec(lin.fp8_scale_name, F32, scale_shape), OutKind.FP8_SCALE, linear=lin)
            )
        shards.append(plan)
    if head_plan:
        # Its own file in a subdirectory: vLLM globs only the root's *.safetensors (and,
        # with an index, only files of its weight_map), so stock vLLM never sees it.
        head_file = ShardPlan(DRAFT_HEAD_FILE, ShardAction.REWRITE, indexed=False)
        head_dtype = F8_E4M3 if head_plan.dtype is HeadDtype.FP8 else BF16
        head_spec = TensorSpec(head_plan.tensor, head_dtype, (head_plan.rows, head_plan.hidden))
        head_file.tensors.append(OutTensor(head_spec, OutKind.DRAFT_HEAD))
        if head_plan.dtype is HeadDtype.FP8:
            scale_name = head_plan.tensor[: -len("weight")] + "weight_scale"
            head_file.tensors.append(OutTensor(TensorSpec(scale_name, F32, ()), OutKind.DRAFT_HEAD_SCALE))
        shards.append(head_file)

    before = files.total_tensor_bytes
    after = sum(
        s.out_bytes
        if s.action is ShardAction.REWRITE
        else sum(
            t.nbytes for n, t in files.shards[s.file].tensors.items() if files.weight_map.get(n) == s.file
        )
        for s in shards
    )
    return ConversionPlan(
        source_dir=files.directory,
        layout=layout,
        shards=shards,
        linears=list(layout.linears),
        dropped=dropped,
        other_files=other_files(files.directory, files),
        bytes_before=before,
        bytes_after=after,
        draft_head=head_plan,
        sharded=files.index_file is not None,
    )


def _check_shape(lin: Linear) -> None:
    if any(d == 0 for d in lin.shape):
        raise ConversionError(
            f"{lin.weight} has an empty shape {list(lin.shape)}; the checkpoint is corrupt."
        )


def _draft_head_plan(
    files: CheckpointFiles, layout: MtpLayout, rows: int, head_dtype: HeadDtype
) -> DraftHeadPlan:
    tensor = draft_head_name(layout)
    if tensor in files.tensors:
        raise ConversionError(
            f"{files.directory} already has {tensor}; it is already a variant "
            "with a draft head. Convert the original checkpoint instead."
        )
    source = layout.lm_head
    if source is None and layout.tie_word_embeddings:
        source = layout.embedding
    if source is None:
        raise LayoutError(
            f"{files.directory} has no lm_head.weight (and the embeddings are not "
            "tied), so there are no head rows to slice for the draft head."
        )
    info = files.tensors[source]
    hidden = info.shape[1] * (2 if info.dtype == U8 else 1)
    return DraftHeadPlan(rows=rows, hidden=hidden, dtype=head_dtype, source_tensor=source, tensor=tensor)
