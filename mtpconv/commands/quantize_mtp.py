"""``quantize-mtp``: write the ``-mtpfp8`` variant of a checkpoint (DESIGN §5).

Orchestration only: source -> headers -> layout -> plan (validated) -> shard
jobs -> writer -> configs -> manifest. The source is only ever opened for
reading; the output appears atomically, or not at all.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtpconv.checkpoint.digests import HashAhead, known_lfs_digest, sha256_file
from mtpconv.checkpoint.index import CheckpointFiles
from mtpconv.checkpoint.source import Source, open_checkpoint
from mtpconv.checkpoint.writer import atomic_output_dir
from mtpconv.conversion_options import Device, HeadDtype
from mtpconv.errors import ConversionError, Param, interruptible
from mtpconv.gc_pause import paused_gc
from mtpconv.jsonio import read_json
from mtpconv.layouts import MtpLayout, detect_layout, module_of
from mtpconv.low_bit_drafter import low_bit_drafter, unreadable_drafter
from mtpconv.manifest import check_draft_window, read_manifest
from mtpconv.plan import ConversionPlan, build_plan, check_destination
from mtpconv.quantconfig.compressed_tensors import with_declared_layouts
from mtpconv.quantconfig.documents import QuantConfigs, load_quant_configs
from mtpconv.quantconfig.rewrite import RewrittenConfigs
from mtpconv.quantconfig.standard import DrafterDeclaration, declare_drafter

if TYPE_CHECKING:
    # torch is imported only where a conversion needs it (NVFP4 sources, CUDA, a draft
    # vocabulary): --dry-run and a 16-bit CPU conversion need none of it.
    import torch

    from mtpconv.formats.fp8_table import QuantError
    from mtpconv.progress import ProgressCallback


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
    declaration: DrafterDeclaration | None = None
    draft_window: int | None = None

    @property
    def max_rel_l2(self) -> float:
        """The largest relative L2 error of any FP8 tensor (0.0 when none was written)."""
        return max((e.rel_l2 for e in self.errors.values()), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        """The report as ``--json`` prints it."""
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
            "drafter_declaration": None
            if self.declaration is None
            else {
                "style": self.declaration.style.value,
                "reason": self.declaration.reason,
                "algorithms": self.declaration.algos,
            },
            "draft_window": self.draft_window,
        }


# Where a GPU's driver shows itself (NVIDIA, and ROCm's /dev/kfd): without any of these
# torch.cuda.is_available() is False, so `--device auto` needs no torch to pick the CPU.
_GPU_NODES = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/kfd")


def pick_device(device: Device) -> str:
    """The torch device name for ``device``; CUDA must exist when asked for.

    ``cpu``, and ``auto`` on a machine without a GPU driver, are decided without importing
    torch: a 16-bit CPU conversion never needs it.
    """
    choice = Device(device)  # its value ("cpu") names the same choice
    if choice is Device.CPU or (choice is Device.AUTO and not any(map(os.path.exists, _GPU_NODES))):
        return "cpu"
    import torch

    if choice is Device.AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise ConversionError("the FP8 math was asked to run on CUDA, but no CUDA device is available.")
    return "cuda"


def variant_declaration(
    configs: QuantConfigs, files: CheckpointFiles, layout: MtpLayout, plan: ConversionPlan
) -> tuple[RewrittenConfigs, DrafterDeclaration]:
    """The variant's quant configs: the FP8 drafter in the source's dialect (DESIGN §5)."""
    head = [] if plan.draft_head is None else [module_of(plan.draft_head.tensor)]
    return declare_drafter(
        configs, files.tensors, layout, fp8_linears=plan.linears, extra_drafter_modules=head
    )


def _load(
    source_spec: str, revision: str | None, *, headers_only: bool = False
) -> tuple[Source, CheckpointFiles, QuantConfigs, MtpLayout]:
    """Resolve and validate the source; a Hub repo id with ``headers_only`` downloads no weights."""
    source, files = open_checkpoint(source_spec, revision, headers_only=headers_only)
    if read_manifest(source.directory) is not None:
        raise ConversionError(
            f"{source_spec} is already an -mtpfp8 variant (it has mtpconv.json); "
            "convert the original checkpoint instead."
        )
    configs = load_quant_configs(source.directory)
    layout = detect_layout(configs.config, files.tensors)
    return source, files, configs, layout


def _read_sidecar(path: Path) -> dict[str, Any]:
    """The ids file's sidecar (what was counted), or ``{}`` when there is none."""
    if not path.is_file():
        return {}
    doc: dict[str, Any] = read_json(
        path, ConversionError, remedy="run build-draft-vocab again or delete the sidecar"
    )
    return doc


def _draft_ids(draft_vocab: str | os.PathLike[str], layout: MtpLayout) -> tuple[torch.Tensor, dict[str, Any]]:
    """The draft vocab's token ids, validated, and its sidecar's record of what was counted."""
    from mtpconv.formats.draft_ids import load_draft_vocab_ids, sidecar_path

    if layout.vocab_size is None:
        raise ConversionError("config.json has no vocab_size; cannot check the draft vocab ids.")
    ids = load_draft_vocab_ids(draft_vocab, layout.vocab_size)
    vocab_meta = _read_sidecar(sidecar_path(draft_vocab))
    if vocab_meta.get("ids_sha256") not in (None, sha256_file(draft_vocab)):
        vocab_meta = {}  # a stale sidecar from another run: its coverage is not this file's
    return ids, vocab_meta


def _shards_to_hash(files: CheckpointFiles, plan: ConversionPlan) -> list[Path]:
    """The source shards the variant rewrites whose sha256 nobody has recorded yet (for the
    manifest's ``source.files``), hashed in a background thread beside the conversion."""
    root = files.directory
    return [
        root / s.file
        for s in plan.rewritten
        if s.indexed and s.file in files.shards and known_lfs_digest(root / s.file, root) is None
    ]


def quantize_mtp(
    source_spec: str,
    dst: str | os.PathLike[str],
    *,
    revision: str | None = None,
    draft_vocab: str | os.PathLike[str] | None = None,
    draft_head_dtype: HeadDtype = HeadDtype.FP8,
    device: Device = Device.AUTO,
    dry_run: bool = False,
    force: bool = False,
    copy: bool = False,
    draft_window: int | None = None,
    fp8_from_4bit: bool = False,
    progress: ProgressCallback | None = None,
) -> ConversionReport:
    """Write the ``-mtpfp8`` variant of ``source_spec`` to ``dst`` (DESIGN §5).

    ``draft_window`` records a sliding window for the drafter's attention in the
    manifest; it must be below the model's max context. A drafter already stored below
    8 bits is refused (FP8 would make it larger) unless ``fp8_from_4bit``.
    """
    started = time.monotonic()
    # A choice's value ("cpu") names the same member; anything else fails before any read.
    device, draft_head_dtype = Device(device), HeadDtype(draft_head_dtype)
    with paused_gc():  # ~1M acyclic header records for a large checkpoint (mtpconv.gc_pause)
        source, files, configs, layout = _load(source_spec, revision, headers_only=dry_run)
    if draft_window is not None:
        check_draft_window(draft_window, configs.config, str(configs.config_path or source_spec))
    ids, vocab_meta = (None, {}) if draft_vocab is None else _draft_ids(draft_vocab, layout)
    dst_path = Path(dst).expanduser()
    check_destination(source.directory, dst_path)
    layout = replace(layout, linears=with_declared_layouts(configs, layout.linears))
    low_bit = low_bit_drafter(layout, files.tensors)
    unreadable = unreadable_drafter(layout)
    if low_bit is not None and not fp8_from_4bit:
        if unreadable is not None:
            raise ConversionError(f"{low_bit.describe()}. Nothing was written; and {unreadable}.")
        raise ConversionError(
            f"{low_bit.describe()}. Nothing was written; to convert it anyway, pass ",
            Param("fp8_from_4bit", True),
            ".",
        )
    if unreadable is not None:
        raise ConversionError(f"{unreadable}. Nothing was written.")
    with paused_gc():
        plan = build_plan(
            files,
            layout,
            draft_vocab_rows=None if ids is None else int(ids.numel()),
            draft_head_dtype=draft_head_dtype,
        )
        rewritten, declaration = variant_declaration(configs, files, layout, plan)
    new_hf_quant, new_config = rewritten.documents
    report = ConversionReport(
        source=source_spec,
        destination=str(dst_path),
        plan=plan,
        dry_run=dry_run,
        device=device.value,
        draft_vocab_size=None if ids is None else int(ids.numel()),
        declaration=declaration,
        draft_window=draft_window,
    )
    if dry_run:  # headers only: torch is never imported
        return report
    hashes = HashAhead(_shards_to_hash(files, plan))  # on another core while the conversion runs
    try:
        dev = pick_device(device)
        from mtpconv.variant import VariantInputs, write_variant

        inputs = VariantInputs(
            source=source,
            files=files,
            plan=plan,
            config=new_config,
            hf_quant_config=new_hf_quant,
            declaration=declaration,
            device=dev,
            copy=copy,
            draft_ids=ids,
            draft_ids_file=None if draft_vocab is None else Path(draft_vocab),
            vocab_meta=vocab_meta,
            draft_window=draft_window,
            progress=progress,
            source_hashes=hashes,
        )
        with interruptible(dst_path), atomic_output_dir(dst_path, force=force) as tmp:
            written = write_variant(tmp, inputs)
    finally:
        hashes.cancel()  # a failed conversion leaves no hashing behind
    return replace(
        report,
        device=dev,
        errors=written.errors,
        linked=written.linked,
        copied=written.copied,
        seconds=time.monotonic() - started,
    )
