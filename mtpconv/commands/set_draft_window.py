"""``set-draft-window``: set or remove the drafter's attention window of a variant.

Only ``mtpconv.json`` is rewritten (atomically, through a temporary sibling, so a
hard link to it is never written through); no tensor is touched. The manifest
records the sha256 of every variant file but itself, so no digest changes and
the variant stays verifiable by ``publish``. Every key the manifest has is kept
in its order; ``draft_window`` replaces itself or goes after ``drafter``, and a
removed window leaves the document as it was before the window was set.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpconv.errors import ManifestError
from mtpconv.jsonio import read_json, write_text_durably
from mtpconv.manifest import MANIFEST_NAME, check_draft_window, parse_manifest

WINDOW_KEY = "draft_window"
_AFTER_KEY = "drafter"


@dataclass(frozen=True)
class DraftWindowReport:
    """What ``set-draft-window`` recorded."""

    manifest: str  # path of the mtpconv.json
    previous: int | None  # the window before (None: full draft attention)
    window: int | None  # the window now
    changed: bool  # whether mtpconv.json was rewritten

    def to_dict(self) -> dict[str, Any]:
        """The report as ``--json`` prints it."""
        return {
            "manifest": self.manifest,
            "previous": self.previous,
            "draft_window": self.window,
            "changed": self.changed,
        }


def with_window(doc: dict[str, Any], window: int | None) -> dict[str, Any]:
    """``doc`` with ``draft_window`` set to ``window`` (removed when None), key order kept."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key == WINDOW_KEY:
            if window is not None:
                out[key] = window
            continue
        out[key] = value
        if key == _AFTER_KEY and window is not None and WINDOW_KEY not in doc:
            out[WINDOW_KEY] = window
    if window is not None and WINDOW_KEY not in out:
        out[WINDOW_KEY] = window
    return out


def set_draft_window(directory: str | os.PathLike[str], window: int | None) -> DraftWindowReport:
    """Record ``window`` (tokens; None removes it) as the draft attention window of a variant.

    ``window`` must be below the model's max context (config.json's
    ``max_position_embeddings``, under ``text_config`` for a VLM); it is checked
    before anything is written.
    """
    root = Path(directory).expanduser()
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"{root} has no {MANIFEST_NAME}: it is not an mtpconv variant. "
            "Create one with `mtpconv quantize-mtp SRC DST` (which can record the window itself)."
        )
    remedy = "convert the source again or restore the variant"
    doc = read_json(path, ManifestError, remedy=remedy)
    previous = parse_manifest(doc, str(path)).draft_window
    if window is not None:
        config_path = root / "config.json"
        config = read_json(config_path, ManifestError, remedy=remedy)
        check_draft_window(window, config, str(config_path))
    if window == previous:
        return DraftWindowReport(str(path), previous, window, changed=False)
    new = with_window(doc, window)
    parse_manifest(new, str(path))  # what is written must read back
    # Manifest.to_json's encoding, so that removing a window restores the original bytes.
    write_text_durably(path, json.dumps(new, indent=2) + "\n")
    return DraftWindowReport(str(path), previous, window, changed=True)
