"""The MTP families mtpconv knows, as data: one row per family (DESIGN §4).

Each row was read from the vLLM 0.32 MTP class named in ``source`` (its ``__init__`` and
``load_weights``): which config keys declare the drafter's layers, where its tensors live,
which of its linears vLLM builds without a quant method (they stay BF16), and the name
vLLM's quant config sees for a drafter module. `mtpconv.layouts.detect_layout` reads the
rows; a new family is a row here plus a tiny-checkpoint factory, not a new code path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtpconv.families.deepseek_v4 import DEEPSEEK_V4
from mtpconv.families.kimi_k3 import KIMI_K3
from mtpconv.families.types import ATTN_NO_QUANT, NN_LINEAR, NO_QUANT, DrafterAt, Family, VllmNames
from mtpconv.families.unsupported import UNSUPPORTED, VLLM_MODELS, VLLM_PKG

_VLLM, _VLLM_PKG = VLLM_MODELS, VLLM_PKG


_MLA_FP8 = ("MLA q_a/q_b/kv_a/kv_b/o", "routed experts (blocks)", "shared experts")
_DS_PLAIN = (("eh_proj", NN_LINEAR),)
_DSA_PLAIN = (("eh_proj", NN_LINEAR), ("weights_proj", NO_QUANT), ("wk", NO_QUANT))
_MLA_LEAVES = ("q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "wq_b")

# Target modules of the Qwen3-Next / Qwen3.5 models that vLLM 0.32 builds without a quant
# method, whatever the config declares: the GDN layers' conv1d (a ColumnParallelLinear made with
# no quant_config, layers/mamba/gdn/qwen_gdn_linear_attn.py) and the vision tower's patch
# embedding (Conv3dLayer) and position embedding (nn.Embedding) (models/qwen3_vl.py, which
# qwen3_5.py builds its tower with).
_QWEN_GDN_PLAIN = r"\.linear_attn\.conv1d$"
_QWEN_VL_PLAIN = _QWEN_GDN_PLAIN + r"|(^|\.)visual\.(patch_embed\.proj|pos_embed)$"

# Qwen MTP configs: the drafter's layer count, under either key.
_QWEN_LAYER_KEYS = ("mtp_num_hidden_layers", "num_nextn_predict_layers")
_QWEN_MOE_FP8 = ("fc", "attention and MLP linears", "routed experts (blocks)")
# Qwen3.5's model types, dense and MoE alike: its two rows are told apart by `Family.experts`.
_QWEN3_5_TYPES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})


def _deepseek_mtp(name: str, vllm_mtp: tuple[str, ...], source: str, **row: Any) -> Family:
    """A row whose drafter is DeepSeek's MTP layer (``deepseek_mtp.py`` and the classes built
    like it): ``eh_proj`` a plain nn.Linear, an MLA decoder layer with routed and shared
    experts, the shared head BF16."""
    return Family(
        name, vllm_mtp, source, plain=_DS_PLAIN, mla=True, fp8=_MLA_FP8, bf16=("shared_head",), **row
    )


def _deepseek_v32_mtp(model_type: str) -> Family:
    """A row served by ``DeepseekV32MTPModel`` (DeepSeek-V3.2 and GLM-5's glm_moe_dsa): the
    DeepSeek MTP layer with the sparse-attention indexer, NVFP4 releases."""
    return Family(
        model_type,
        ("DeepseekV32MTPModel",),
        _VLLM_PKG + "deepseek_v32/nvidia/mtp.py",
        model_types=frozenset({model_type}),
        plain=_DSA_PLAIN,
        mla=True,
        ships_nvfp4=True,
        fp8=_MLA_FP8,
        bf16=("indexer wq_b / k_norm", "shared_head"),
    )


# Detection order: the first row whose model_type / architecture matches, else the first
# whose marker does. Rows are ordered so that a marker never steals another family's checkpoint.
FAMILIES: tuple[Family, ...] = (
    Family(
        "mimo",
        ("MiMoMTPModel",),
        _VLLM + "mimo_mtp.py",
        model_types=frozenset({"mimo"}),
        drafter_at=DrafterAt.MTP_LAYERS,
        vllm_names=VllmNames.MTP_LAYERS_AFTER_TARGET,
        plain=(("input_proj", NN_LINEAR),),
        marker=r"^model\.mtp_layers\.",
        draft_vocab=True,
    ),
    Family(
        "mimo_v2",
        ("MiMoV2MTPModel", "MiMoV2OmniMTPModel"),
        _VLLM + "mimo_v2_mtp.py",
        model_types=frozenset({"mimo_v2", "mimo_v2_flash", "mimo_v2_omni"}),
        architectures=frozenset({"MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM", "MiMoV2OmniForCausalLM"}),
        drafter_at=DrafterAt.MODEL_MTP,
        fp8=("eh_proj (ReplicatedLinear)", "attention q/k/v/o", "dense MLP"),
    ),
    Family(
        "nemotron_h",
        ("NemotronHMTPModel",),
        _VLLM + "nemotron_h_mtp.py",
        model_types=frozenset({"nemotron_h", "nemotron_h_puzzle"}),
        drafter_at=DrafterAt.MTP,
        step_pattern_key="mtp_hybrid_override_pattern",
        ships_nvfp4=True,
        fp8=(
            "eh_proj (ColumnParallelLinear)",
            "attention q/k/v/o",
            "routed non-gated experts up/down (blocks)",
            "shared experts",
        ),
    ),
    _deepseek_v32_mtp("deepseek_v32"),
    _deepseek_v32_mtp("glm_moe_dsa"),
    Family(
        "glm5_next",
        ("Glm5NextMTPModel",),
        _VLLM_PKG + "glm5next/common/mtp.py",
        model_types=frozenset({"glm5_next", "glm5_next_text"}),
        architectures=frozenset({"Glm5NextForCausalLM", "Glm5NextForConditionalGeneration"}),
        # Glm5NextDecoderLayer(is_mtp_layer=True) builds its MLA attention (indexer included)
        # with quant_config=None; only the MoE gets the quant config
        plain=(*_DSA_PLAIN, *((leaf, ATTN_NO_QUANT) for leaf in _MLA_LEAVES)),
        mla=True,
        fp8=("routed experts (blocks)", "shared experts"),
        bf16=("MLA attention and its indexer", "shared_head"),
    ),
    _deepseek_mtp(
        "glm4_moe_lite",
        ("Glm4MoeLiteMTPModel",),
        _VLLM + "glm4_moe_lite_mtp.py",
        model_types=frozenset({"glm4_moe_lite"}),
    ),
    Family(
        "glm4_moe",
        ("Glm4MoeMTPModel",),
        _VLLM + "glm4_moe_mtp.py",
        model_types=frozenset({"glm4_moe"}),
        plain=_DS_PLAIN,
        fp8=("attention q/k/v/o", "routed experts (blocks)", "shared experts"),
        bf16=("shared_head",),
    ),
    _deepseek_mtp(
        "kimi_k2",
        ("DeepSeekMTPModel",),
        _VLLM + "deepseek_mtp.py",
        model_types=frozenset({"kimi_k2"}),
    ),
    _deepseek_mtp(
        "deepseek_v3",
        ("DeepSeekMTPModel",),
        _VLLM + "deepseek_mtp.py",
        model_types=frozenset({"deepseek_v3"}),
        marker=r"^model\.layers\.\d+\.eh_proj\.",
    ),
    _deepseek_mtp(
        "openpangu",
        ("OpenPanguMTPModel",),
        _VLLM + "openpangu_mtp.py",
        model_types=frozenset({"pangu_ultra_moe", "pangu_ultra_moe_mtp"}),
        architectures=frozenset({"PanguUltraMoEForCausalLM"}),
    ),
    Family(
        "longcat_flash",
        ("LongCatFlashMTPModel",),
        _VLLM + "longcat_flash_mtp.py",
        model_types=frozenset({"longcat_flash"}),
        architectures=frozenset({"LongcatFlashForCausalLM"}),
        layer_keys=(),
        drafter_at=DrafterAt.MODEL_MTP,
        vllm_names=VllmNames.MTP_AFTER_TARGET_BARE_EH,
        # vLLM: mtp_start_layer_idx = num_layers * 2, num_mtp_layers = 1
        start_key="num_layers",
        start_factor=2,
        fixed_layers=1,
        mla=True,
        fp8=("eh_proj (ReplicatedLinear)", "MLA q_a/q_b/kv_a/kv_b/o", "dense MLP"),
    ),
    Family(
        "dots3_note",
        ("Dots3NoteMTPModel",),
        _VLLM_PKG + "dots3_note/nvidia/mtp.py",
        model_types=frozenset({"dots3_note", "dots3_note_mtp"}),
        architectures=frozenset({"Dots3NoteForCausalLM"}),
        # eh_proj is a quantizable ReplicatedLinear here; a full-attention MTP layer's
        # indexer fuses wk + weights_proj without a quant method (DeepSeek-V3.2's)
        plain=_DSA_PLAIN[1:],
        mla=True,
        fp8=("eh_proj (ReplicatedLinear)", "MLA q_a/q_b/kv_a/kv_b/o and g_proj", "dense MLP"),
        bf16=("shared_head", "model.mtp.embed_tokens"),
    ),
    Family(
        "bailing_moe_v3",
        ("BailingMoeV3MTPModel",),
        _VLLM + "bailing_moe_v3_mtp.py",
        # model_type "bailing_hybrid" is V2.5's too: V3 is told by its architecture
        architectures=frozenset({"BailingMoeV3ForCausalLM"}),
        vllm_names=VllmNames.ATTENTION_AS_SELF_ATTN,
        mla=True,
        fp8=(
            "eh_proj (ReplicatedLinear)",
            "MLA q_a/q_b/kv_a/kv_b, g_proj, dense",
            "routed experts (blocks)",
            "shared experts",
        ),
        bf16=("shared_head",),
    ),
    _deepseek_mtp(
        "bailing_moe_v2_5",
        ("BailingMoeV25MTPModel",),
        _VLLM + "bailing_moe_mtp.py",
        model_types=frozenset({"bailing_hybrid"}),
        architectures=frozenset({"BailingMoeV2_5ForCausalLM"}),
    ),
    Family(
        "ernie4_5_moe",
        ("ErnieMTPModel",),
        _VLLM + "ernie_mtp.py",
        model_types=frozenset({"ernie4_5_moe", "ernie_mtp"}),
        drafter_at=DrafterAt.MTP_PARTS,
        vllm_names=VllmNames.MTP_PARTS_AFTER_TARGET,
        # mtp_block is a LlamaDecoderLayer: dense attention and MLP, all quantizable
        fp8=("attention q/k/v/o", "dense MLP"),
        bf16=("mtp_linear_proj.{i} (vLLM nn.Linear)",),
    ),
    Family(
        "exaone_moe",
        ("ExaoneMoeMTP",),
        _VLLM + "exaone_moe_mtp.py",
        model_types=frozenset({"exaone_moe", "exaone_moe_mtp"}),
        drafter_at=DrafterAt.MTP,
        # the MTP decoder layer is built with is_mtp=True: a dense gated MLP
        fp8=("fc (ColumnParallelLinear)", "attention q/k/v/o", "dense MLP"),
    ),
    Family(
        "exaone4_5",
        ("Exaone4_5_MTP",),
        _VLLM + "exaone4_5_mtp.py",
        model_types=frozenset({"exaone4_5", "exaone4_5_mtp"}),
        drafter_at=DrafterAt.MTP,
        fixed_layers=1,  # getattr(config, "num_nextn_predict_layers", 1)
        fp8=("fc (ColumnParallelLinear)", "attention q/k/v/o", "dense MLP"),
    ),
    Family(
        "hy_v3",
        ("HYV3MTPModel",),
        _VLLM + "hy_v3_mtp.py",
        model_types=frozenset({"hy_v3", "hy_v3_mtp"}),
        plain=_DS_PLAIN,
        fp8=("attention q/k/v/o", "routed experts (blocks)", "shared_mlp"),
    ),
    Family(
        "glm_ocr",
        ("GlmOcrMTPModel",),
        _VLLM + "glm_ocr_mtp.py",
        model_types=frozenset({"glm_ocr", "glm_ocr_text"}),
        plain=_DS_PLAIN,
        # the drafter is model.language_model.layers.{N}.*: a dense Glm4DecoderLayer
        fp8=("attention q/k/v/o", "dense MLP"),
        bf16=("shared_head",),
    ),
    Family(
        "step3p5",
        ("Step3p5MTP",),
        _VLLM + "step3p5_mtp.py",
        model_types=frozenset({"step3p5", "step3p7"}),
        architectures=frozenset({"Step3p5ForCausalLM", "Step3p7ForConditionalGeneration"}),
        vllm_names=VllmNames.MTP_BLOCK,
        plain=_DS_PLAIN,
        ships_nvfp4=True,
        fp8=("attention q/k/v/o", "shared expert"),
        bf16=("3-D routed experts moe.{gate,up,down}_proj (no FP8 layout for them yet)", "shared_head"),
    ),
    Family(
        "qwen4exp",
        ("Qwen4ExpMTP",),
        _VLLM_PKG + "qwen4_exp",
        model_types=frozenset({"qwen4exp", "qwen4_exp", "qwen4_exp_text"}),
        layer_keys=_QWEN_LAYER_KEYS,
        drafter_at=DrafterAt.MTP,
        marker=r"(^|\.)mtp\.fc_embedding\.",
        config_marker="hc_count",
        fp8=("fc_embedding", "fc_hidden", "attention and MLP linears"),
        bf16=("shared_head",),
    ),
    Family(
        "qwen3_next",
        ("Qwen3NextMTP",),
        _VLLM + "qwen3_next_mtp.py",
        model_types=frozenset({"qwen3_next"}),
        layer_keys=_QWEN_LAYER_KEYS,
        drafter_at=DrafterAt.MTP,
        ships_nvfp4=True,
        draft_vocab=True,
        fp8=_QWEN_MOE_FP8,
        target_plain=_QWEN_GDN_PLAIN,
    ),
    Family(
        # before the Qwen3.5 rows: its text_config is a qwen3_5_moe_text
        "interns2_mobius",
        ("InternS2MobiusMTP",),
        _VLLM + "interns2_mobius.py",
        model_types=frozenset({"interns2_mobius"}),
        layer_keys=("mtp_num_hidden_layers",),
        drafter_at=DrafterAt.MTP,
        # a Qwen3_5MoeMTP whose MoE has its own mtp_num_experts (vLLM's speculative config)
        fp8=_QWEN_MOE_FP8,
        target_plain=_QWEN_GDN_PLAIN,
    ),
    Family(
        "qwen3_5_moe",
        ("Qwen3_5MoeMTP",),
        _VLLM + "qwen3_5_mtp.py",
        model_types=_QWEN3_5_TYPES,
        layer_keys=_QWEN_LAYER_KEYS,
        drafter_at=DrafterAt.MTP,
        experts=True,
        ships_nvfp4=True,
        draft_vocab=True,
        fp8=_QWEN_MOE_FP8,
        target_plain=_QWEN_VL_PLAIN,
    ),
    Family(
        "qwen3_5",
        ("Qwen3_5MTP",),
        _VLLM + "qwen3_5_mtp.py",
        model_types=_QWEN3_5_TYPES,
        layer_keys=_QWEN_LAYER_KEYS,
        drafter_at=DrafterAt.MTP,
        ships_nvfp4=True,
        draft_vocab=True,
        fp8=("fc", "attention and MLP linears"),
        target_plain=_QWEN_VL_PLAIN,
    ),
    KIMI_K3,
    DEEPSEEK_V4,
)

BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}


def readme_table() -> str:
    """The README's table of families: what each variant stores FP8 and what stays BF16, then
    every vLLM MTP architecture without a row, with the reason."""
    lines = [
        "| family | vLLM MTP class (file) | FP8 in the variant | stays BF16 |",
        "|---|---|---|---|",
    ]
    for row in FAMILIES:
        plain = [f"{leaf} (vLLM {why.split(' (')[0].removeprefix('builds it ')})" for leaf, why in row.plain]
        bf16 = [*plain, *row.bf16, "norms, routers, embeddings, heads"]
        lines.append(
            f"| {row.name} | {', '.join(row.vllm_mtp)} (`{row.source}`) | {'; '.join(row.fp8)} | "
            f"{'; '.join(bf16)} |"
        )
    for arch, why in UNSUPPORTED.items():
        lines.append(f"| (no row) | {arch} | — | {why} |")
    return "\n".join(lines) + "\n"


# Every config key any row reads for its MTP layer count: a config that sets one of them
# but matches no row is a family nobody has looked at (layouts.UnknownFamilyError).
LAYER_KEYS: tuple[str, ...] = tuple(
    dict.fromkeys(
        [k for f in FAMILIES for k in f.layer_keys] + ["num_mtp_layers", "num_mtp_modules", "mtp_num_layers"]
    )
)


def mtp_start_layer(name: str, tcfg: Mapping[str, Any]) -> int | None:
    """The layer index vLLM gives the family's first MTP layer (``num_hidden_layers`` unless
    the row says otherwise); None when the config lacks the key."""
    row = BY_NAME.get(name)
    key, factor = (row.start_key, row.start_factor) if row is not None else ("num_hidden_layers", 1)
    value = tcfg.get(key)
    return value * factor if isinstance(value, int) and not isinstance(value, bool) else None


def family(name: str) -> Family | None:
    """The row called ``name`` (None for ``unknown``)."""
    return BY_NAME.get(name)


def vllm_quantizable(linears: Mapping[str, str], name: str) -> dict[str, str]:
    """A checkpoint's linear modules (-> storage) that vLLM may quantize, for family ``name``."""
    row = BY_NAME.get(name)
    return dict(linears) if row is None else row.vllm_quantizable(linears)


def find_family(config: Mapping[str, Any], tcfg: Mapping[str, Any], names: list[str]) -> Family | None:
    """The row for a checkpoint: by model_type / architecture first, then by marker."""
    types = {str(t) for t in (config.get("model_type"), tcfg.get("model_type")) if t}
    archs = {str(a) for a in (config.get("architectures") or []) + (tcfg.get("architectures") or [])}
    model_type = str(tcfg.get("model_type") or config.get("model_type") or "")
    has_experts = "moe" in model_type or any(
        isinstance(tcfg.get(k), int) for k in ("num_experts", "n_routed_experts")
    )
    for row in FAMILIES:
        if row.matches_type(types, archs, has_experts):
            return row
    for row in FAMILIES:
        if row.matches_marker(tcfg, names):
            return row
    return None
