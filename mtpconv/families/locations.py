"""Where a family's checkpoint keeps its drafter: the name prefixes of its tensors and the
layer index in their names, per `DrafterAt` (the row's ``drafter_at``)."""

from __future__ import annotations

import re

from mtpconv.families.types import DrafterAt, Family
from mtpconv.names import strip_text_prefix

# The layer index in a drafter tensor's name, where each kind of family stores it.
LAYER_INDEX: dict[DrafterAt, re.Pattern[str]] = {
    DrafterAt.MTP: re.compile(r"mtp\.layers\.(\d+)\."),
    DrafterAt.MODEL_MTP: re.compile(r"model\.mtp\.layers\.(\d+)\."),
    DrafterAt.AFTER_TARGET: re.compile(r"model\.layers\.(\d+)\."),
    DrafterAt.MTP_LAYERS: re.compile(r"model\.mtp_layers\.(\d+)\."),
    DrafterAt.MTP_PARTS: re.compile(r"model\.mtp_block\.(\d+)\."),
    DrafterAt.MTP_INDEXED: re.compile(r"^mtp\.(\d+)\."),
}


def drafter_prefixes(
    row: Family, names: list[str], n_layers: int | None, declared: int | None
) -> tuple[str, ...]:
    """The name prefixes of the drafter's tensors, where the row says they live."""
    if row.drafter_at is DrafterAt.MTP_LAYERS:
        return ("model.mtp_layers.",)
    if row.drafter_at is DrafterAt.MODEL_MTP:
        return ("model.mtp.",)
    if row.drafter_at is DrafterAt.MTP_PARTS:
        return tuple(f"model.mtp_{part}." for part in ("block", "emb_norm", "hidden_norm", "linear_proj"))
    if row.drafter_at in (DrafterAt.MTP, DrafterAt.MTP_INDEXED):
        mtp_names = [n for n in names if strip_text_prefix(n)[1].startswith("mtp.")]
        return (f"{strip_text_prefix(mtp_names[0])[0] if mtp_names else ''}mtp.",)
    layered = layers_after_target(names, n_layers)
    start = n_layers or 0
    count = declared if declared is not None else len(layered)
    # a VLM keeps its text layers, the drafter's included, under its text prefix (GLM-OCR, Kimi-K3)
    vlm = ("model.language_model.", "language_model.model.")
    base = next((b for b in vlm if any(n.startswith(b + "layers.") for n in names)), "model.")
    return tuple(f"{base}layers.{start + i}." for i in range(count))


def layers_after_target(names: list[str], n_layers: int | None, *, any_module: bool = False) -> list[int]:
    """Indices ``>= num_hidden_layers`` of ``model[.language_model].layers.*`` holding an
    ``eh_proj`` (any tensor)."""
    if n_layers is None:
        return []
    tail = "" if any_module else r"eh_proj\."
    pattern = re.compile(r"(?:language_model\.)?model\.(?:language_model\.)?layers\.(\d+)\." + tail)
    found = {int(m.group(1)) for n in names if (m := pattern.match(n))}
    return sorted(i for i in found if i >= n_layers)
