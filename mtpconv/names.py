"""Checkpoint names: the prefixes multimodal checkpoints put before the text model.

Written once: layouts, the quant-config matcher and the vLLM plugin all strip and
compare names through this module; the reports fold routed experts' names here.
"""

from __future__ import annotations

import re

# Where a VLM checkpoint keeps its language model, longest first.
TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.")
# The prefixes under which a checkpoint may store the drafter's ``mtp.*`` tensors.
DRAFTER_PREFIXES = ("model.language_model.", "language_model.", "model.")
# Parts of a VLM that belong to the vision side (never the drafter).
VISION_MARKERS = ("vision_tower", "vision_model", "vit_large_projector")


def strip_text_prefix(name: str) -> tuple[str, str]:
    """``(prefix, rest)`` for a name under a VLM's language model (``("", name)`` otherwise)."""
    for prefix in TEXT_PREFIXES:
        if name.startswith(prefix):
            return prefix, name[len(prefix) :]
    return "", name


def drafter_name(name: str) -> str:
    """``model.language_model.mtp.fc`` -> ``mtp.fc``: the name vLLM's MTP classes use.

    Names not under ``mtp.`` are returned unchanged.
    """
    for prefix in DRAFTER_PREFIXES:
        if name.startswith(prefix + "mtp."):
            return name[len(prefix) :]
    return name


def drafter_alias(module: str) -> str | None:
    """The ``mtp.*`` name of a VLM-prefixed drafter module, or None when it has no prefix.

    Only the two prefixes vLLM's Qwen MTP classes strip (``model.`` alone is not a VLM).
    """
    for prefix in DRAFTER_PREFIXES[:2]:
        if module.startswith(prefix) and module[len(prefix) :].startswith("mtp."):
            return module[len(prefix) :]
    return None


_EXPERT_INDEX = re.compile(r"\.experts\.\d+\.")


def fold_expert_index(name: str) -> str:
    """``...experts.17.up_proj`` -> ``...experts.*.up_proj``: one name for every routed expert."""
    return _EXPERT_INDEX.sub(".experts.*.", name)
