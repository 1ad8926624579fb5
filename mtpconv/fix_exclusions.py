"""``fix-exclusions``: only the config repair, every weight file hard-linked.

Every module stored unquantized but declared quantized (the real ``mtp.fc`` gap
of NVIDIA's Qwen3.5 / Qwen3-Next NVFP4 exports) becomes excluded in both
hf_quant_config.json and config.json; nothing else changes. Written to a new
directory atomically, or with ``--in-place`` into SRC's two JSON files (the
originals kept as ``.bak``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpconv.checkpoint.index import INDEX_NAME, CheckpointFiles
from mtpconv.checkpoint.source import load_files, resolve_source
from mtpconv.checkpoint.writer import atomic_output_dir, link_or_copy, write_json
from mtpconv.errors import OutputError, interruptible
from mtpconv.jsonio import dumps_json
from mtpconv.layouts import linear_modules
from mtpconv.plan import check_destination, other_files
from mtpconv.quant_config import QuantConfigs, fixed_exclusion_configs, load_quant_configs


@dataclass
class FixReport:
    source: str
    destination: str
    excluded: list[str]
    in_place: bool
    dry_run: bool = False
    backups: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "destination": self.destination,
                "newly_excluded": self.excluded, "in_place": self.in_place,
                "dry_run": self.dry_run, "backups": self.backups}  # fmt: skip


def fix_exclusions(
    source_spec: str,
    dst: str | os.PathLike[str] | None,
    *,
    revision: str | None = None,
    in_place: bool = False,
    force: bool = False,
    copy: bool = False,
    dry_run: bool = False,
) -> FixReport:
    """Exclude every module stored unquantized but declared quantized; nothing else."""
    source = resolve_source(source_spec, revision)
    files = load_files(source)
    configs = load_quant_configs(source.directory)
    stored = linear_modules(files.tensors)
    new_hf_quant, new_config = fixed_exclusion_configs(configs, stored)
    excluded = _newly_excluded(configs, new_hf_quant, new_config)
    if in_place and dst is not None:
        raise OutputError("give either DST or --in-place, not both.")
    if not in_place and dst is None:
        raise OutputError("give a destination directory, or --in-place to edit SRC's JSON files "
                          "(a .bak copy of each is kept).")  # fmt: skip
    target = source.directory if in_place else Path(dst).expanduser()  # type: ignore[arg-type]
    report = FixReport(source_spec, str(target), excluded, in_place, dry_run)
    if dry_run:
        return report
    if in_place:
        if source.repo_id:
            raise OutputError("--in-place edits a local directory; a Hub snapshot is read-only. "
                              "Give a destination instead.")  # fmt: skip
        if not excluded:
            return report
        report.backups = _rewrite_in_place(source.directory, new_hf_quant, new_config)
        return report
    check_destination(source.directory, target)
    with interruptible(target), atomic_output_dir(target, force=force) as tmp:
        for rel in list(files.shards) + _non_weight_files(source.directory, files):
            out = tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(source.directory / rel, out, copy=copy)
        write_json(tmp / "config.json", dumps_json(new_config))
        if new_hf_quant is not None:
            write_json(tmp / "hf_quant_config.json", dumps_json(new_hf_quant))
    return report


def _non_weight_files(directory: Path, files: CheckpointFiles) -> list[str]:
    extra = [INDEX_NAME] if files.index_file else []
    return extra + other_files(directory, files)


def _rewrite_in_place(directory: Path, hf_quant: dict[str, Any] | None,
                      config: dict[str, Any]) -> list[str]:  # fmt: skip
    """Replace SRC's two JSON files, keeping the first ``.bak`` of each (the original).

    Both new files are written and fsynced before either replaces its original,
    so the window in which the two disagree is two renames long.
    """
    staged = []
    for name, doc in (("config.json", config), ("hf_quant_config.json", hf_quant)):
        if doc is None:
            continue
        tmp = directory / f".{name}.mtpconv-tmp"
        write_json(tmp, dumps_json(doc))
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


def _newly_excluded(configs: QuantConfigs, hf_quant: dict[str, Any] | None,
                    config: dict[str, Any]) -> list[str]:  # fmt: skip
    def excl(hq: dict[str, Any] | None, cfg: dict[str, Any]) -> list[str]:
        if hq is not None:
            q = hq.get("quantization", {})
            return list(q.get("exclude_modules", []) or [])
        qc = cfg.get("quantization_config", {})
        return list(qc.get("ignore", []) or []) if isinstance(qc, dict) else []

    before = excl(configs.hf_quant, configs.config)
    return [p for p in excl(hf_quant, config) if p not in before]
