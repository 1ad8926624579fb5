"""Every per-family fact, as data (DESIGN §4, §8): the rows (`rows`, with `kimi_k3` and
`deepseek_v4`), the row type and its vocabularies (`types`), where a drafter lives
(`locations`), the names vLLM gives its modules (`vllm_names`), and the vLLM MTP
architectures without a row, with the reason (`unsupported`). The rest of mtpconv imports
from here."""

from __future__ import annotations

from mtpconv.families.locations import LAYER_INDEX, drafter_prefixes, layers_after_target
from mtpconv.families.rows import (
    BY_NAME,
    FAMILIES,
    LAYER_KEYS,
    family,
    find_family,
    mtp_start_layer,
    readme_table,
    vllm_quantizable,
)
from mtpconv.families.types import STEP_MODULES, DrafterAt, Family, VllmNames
from mtpconv.families.unsupported import UNSUPPORTED
from mtpconv.families.vllm_names import vllm_drafter_key

__all__ = [
    "BY_NAME",
    "FAMILIES",
    "LAYER_INDEX",
    "LAYER_KEYS",
    "STEP_MODULES",
    "UNSUPPORTED",
    "DrafterAt",
    "Family",
    "VllmNames",
    "drafter_prefixes",
    "family",
    "find_family",
    "layers_after_target",
    "mtp_start_layer",
    "readme_table",
    "vllm_drafter_key",
    "vllm_quantizable",
]
