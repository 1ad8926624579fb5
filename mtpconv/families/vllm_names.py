"""How vLLM names a drafter module: the checkpoint name -> the name vLLM's quant config sees,
per family row's `VllmNames` (each rename read from that family's vLLM MTP class)."""

from __future__ import annotations

import re

from mtpconv.families.rows import family as family_row
from mtpconv.families.types import STEP_MODULES, VllmNames
from mtpconv.names import drafter_name

_MTP_PARTS = re.compile(r"model\.mtp_(block|emb_norm|hidden_norm|linear_proj)\.(\d+)(?:\.(.*))?$")
_MTP_INDEXED = re.compile(r"mtp\.(\d+)\.(.*)$")


def vllm_drafter_key(module: str, family: str, num_layers: int | None) -> str:
    """The name vLLM's quant config sees for a drafter module (the family row's `VllmNames`).

    Qwen MTP classes strip a VLM prefix (``mtp.…``); MiMo builds its MTP block with the
    prefix ``model.layers.{N+i}`` while the checkpoint says ``model.mtp_layers.{i}``; Step-3.5
    puts the decoder block under ``model.layers.{k}.mtp_block``; LongCat-Flash names its
    ``model.mtp.layers.{i}`` block ``model.layers.{2 * num_layers + i}`` and its eh_proj ``eh_proj``
    (``num_layers``: `mtp_start_layer`); Bailing-V3 renames ``attention`` to ``self_attn``;
    ERNIE-4.5 maps ``model.mtp_block.{i}`` to ``model.layers.{N + i}``; DeepSeek-V4 ``mtp.{i}`` to
    ``model.layers.{N + i}`` (its decoder block too: vLLM builds it under the layer's own prefix);
    GLM-OCR and Kimi-K3 drop their VLM's ``language_model.`` (Kimi-K3 builds its block with prefix
    ``model.layers.{N+i}``).
    """
    row = family_row(family)
    naming = row.vllm_names if row is not None else VllmNames.AS_STORED
    if naming is VllmNames.MTP_LAYERS_AFTER_TARGET and module.startswith("model.mtp_layers.") and num_layers:
        idx, _, rest = module[len("model.mtp_layers.") :].partition(".")
        return f"model.layers.{num_layers + int(idx)}.{rest}"
    if naming is VllmNames.MTP_AFTER_TARGET_BARE_EH and module.startswith("model.mtp.layers.") and num_layers:
        idx, _, rest = module[len("model.mtp.layers.") :].partition(".")
        if rest == "eh_proj":
            return rest
        return f"model.layers.{num_layers + int(idx)}.{rest.removeprefix('transformer_layer.')}"
    parts = _MTP_PARTS.match(module)
    if naming is VllmNames.MTP_PARTS_AFTER_TARGET and parts and num_layers:
        part, idx, rest = parts.groups()
        layer = f"model.layers.{num_layers + int(idx)}"
        return f"{layer}.{rest}" if part == "block" else f"{layer}.mtp_{part}{'.' + rest if rest else ''}"
    indexed = _MTP_INDEXED.match(module)
    if naming is VllmNames.MTP_INDEX_AFTER_TARGET and indexed and num_layers:
        # DeepSeekV4MTP._to_spec_layer_name, and its loader's shared_experts.w2 -> down_proj
        rest = indexed.group(2).replace("shared_experts.w2", "shared_experts.down_proj")
        return f"model.layers.{num_layers + int(indexed.group(1))}.{rest}"
    if naming is VllmNames.ATTENTION_AS_SELF_ATTN:
        return drafter_name(module).replace(".attention.", ".self_attn.")
    if naming is VllmNames.MTP_BLOCK and module.startswith("model.layers."):
        idx, _, rest = module[len("model.layers.") :].partition(".")
        if not rest.startswith(STEP_MODULES):
            return f"model.layers.{idx}.mtp_block.{rest}"
    if module.startswith("model.language_model.layers."):  # the MTP classes drop "language_model."
        return "model." + module[len("model.language_model.") :]
    if module.startswith("language_model.model.layers."):  # Kimi-K3's loader strips "language_model."
        return module[len("language_model.") :]
    return drafter_name(module)
