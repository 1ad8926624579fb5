"""``fix-exclusions``: only the config repair, every weight file hard-linked.

Every module stored unquantized but declared quantized (the real ``mtp.fc`` gap
of NVIDIA's Qwen3.5 / Qwen3-Next NVFP4 exports) becomes excluded in both
hf_quant_config.json and config.json (wherever config.json declares its
quantization: top level or ``text_config``); nothing else changes. Written to a
new directory atomically, or (:data:`IN_PLACE`) into SRC's JSON files (the
originals kept as ``.bak``). What was excluded is what the rewriter reports.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from mtpconv.checkpoint.index import INDEX_NAME, CheckpointFiles
from mtpconv.checkpoint.source import load_files, resolve_source
from mtpconv.checkpoint.writer import atomic_output_dir, link_or_copy, write_json
from mtpconv.errors import LayoutError, OutputError, interruptible
from mtpconv.families import vllm_quantizable
from mtpconv.gc_pause import paused_gc
from mtpconv.layouts import detect_layout, linear_modules
from mtpconv.plan import check_destination, other_files
from mtpconv.quantconfig.documents import load_quant_configs
from mtpconv.quantconfig.rewrite import ExclusionEdit, fixed_exclusion_configs


class Target(Enum):
    """Where the fixed configs go when not to a new directory."""

    IN_PLACE = "in-place"  # the source's own JSON files, a .bak copy of each kept


IN_PLACE = Target.IN_PLACE


@dataclass
class FixReport:
    """What ``fix-exclusions`` excluded (or would exclude), and where."""

    source: str
    destination: str
    excluded: list[str]  # exclusion patterns appended
    in_place: bool
    dry_run: bool = False
    backups: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)  # modules now declared unquantized
    edits: list[ExclusionEdit] = field(default_factory=list)  # which list got which patterns

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "destination": self.destination,
            "newly_excluded": self.excluded,
            "excluded_modules": self.modules,
            "edits": [{"file": e.document, "key": e.key, "added": list(e.added)} for e in self.edits],
            "in_place": self.in_place,
            "dry_run": self.dry_run,
            "backups": self.backups,
        }


def fix_exclusions(
    source_spec: str,
    dst: str | os.PathLike[str] | Target,
    *,
    revision: str | None = None,
    force: bool = False,
    copy: bool = False,
    dry_run: bool = False,
) -> FixReport:
    """Exclude every module stored unquantized but declared quantized; nothing else.

    ``dst`` is a new directory (shards hard-linked), or :data:`IN_PLACE` for the
    source's own JSON files (a local directory only; a ``.bak`` copy of each is kept).
    """
    source = resolve_source(source_spec, revision)
    files = load_files(source)
    configs = load_quant_configs(source.directory)
    with paused_gc():  # ~1M acyclic records for a large checkpoint (mtpconv.gc_pause)
        try:  # the family only narrows which modules vLLM may quantize; repairs need no drafter
            family = detect_layout(configs.config, files.tensors, strict=False).family
        except LayoutError:
            family = "unknown"
        fixed = fixed_exclusion_configs(configs, vllm_quantizable(linear_modules(files.tensors), family))
    in_place = dst is IN_PLACE
    target = source.directory if isinstance(dst, Target) else Path(dst).expanduser()
    report = FixReport(
        source_spec,
        str(target),
        list(fixed.patterns),
        in_place,
        dry_run,
        modules=list(fixed.excluded_modules),
        edits=list(fixed.edits),
    )
    if dry_run:
        return report
    documents = fixed.as_configs().dumped()
    if in_place:
        if source.repo_id:
            raise OutputError(
                f"{source_spec} is a Hub repo, whose snapshot is read-only: it cannot be edited "
                "in place. Give a destination instead."
            )
        if not fixed.changed:
            return report
        report.backups = _rewrite_in_place(source.directory, documents)
        return report
    check_destination(source.directory, target)
    with interruptible(target), atomic_output_dir(target, force=force) as tmp:
        for rel in list(files.shards) + _non_weight_files(source.directory, files):
            out = tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(source.directory / rel, out, copy=copy)
        for name, text in documents.items():
            write_json(tmp / name, text)
    return report


def _non_weight_files(directory: Path, files: CheckpointFiles) -> list[str]:
    extra = [INDEX_NAME] if files.index_file else []
    return extra + other_files(directory, files)


def _rewrite_in_place(directory: Path, documents: dict[str, str]) -> list[str]:
    """Replace SRC's JSON files, keeping the first ``.bak`` of each (the original).

    Every new file is written and fsynced before any replaces its original,
    so the window in which the two disagree is two renames long.
    """
    staged = []
    for name, text in documents.items():
        tmp = directory / f".{name}.mtpconv-tmp"
        write_json(tmp, text)
        staged.append((name, tmp))
    backups = []
    for name, _ in staged:
        backup = directory / f"{name}.bak"
        if not backup.exists():
            shutil.copy2(directory / name, backup)
        backups.append(str(backup))
    for name, tmp in staged:
        os.replace(tmp, directory / name)
    return backups
