"""The FP8 drafter declared in a compressed-tensors source's own config (DESIGN §5).

A compressed-tensors ``quantization_config`` (llm-compressor exports) gets one more config
group, `DRAFTER_GROUP`, whose ``re:`` targets name exactly the drafter's FP8 linears:
weights FP8 per output channel (static, symmetric), activations FP8 per token (dynamic),
``format: float-quantized``. Why this shape, from vLLM 0.32's compressed-tensors config:

- groups are keyed by target string, so reusing ``Linear`` would overwrite the source's
  group; a layer-name or ``re:`` target beats a class-name target whatever the order, so
  the drafter group wins over the source's ``Linear`` without touching it;
- dotted targets are renamed by the target model's ``hf_to_vllm_mapper``, ``re:`` targets
  are kept as written; a Qwen-style drafter is built under ``mtp.`` whatever prefix its
  tensors are stored with, so anchored ``re:^mtp\\.`` targets reach it in every class;
- ``ignore`` is checked first, so entries that skip a drafter FP8 linear are removed;
  every other module that such an entry skipped is ignored again by an exact entry, so no
  other module changes declaration;
- channel strategy (scale ``[out, 1]``): the tensor strategy requantizes through a C op
  that is empty on CPU builds; channel weights + dynamic token inputs also run for routed
  experts (``CompressedTensorsW8A8Fp8MoEMethod``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from mtpconv.errors import QuantConfigError
from mtpconv.formats.scale_layout import ScaleLayout
from mtpconv.layouts import Linear, Stored
from mtpconv.names import drafter_alias
from mtpconv.quantconfig import methods
from mtpconv.quantconfig.declarations import DeclaredQuant, all_declarations, declared_algorithm
from mtpconv.quantconfig.documents import QuantConfigs, quant_location
from mtpconv.quantconfig.match import ExclusionPattern, ModuleSet, ct_expert_names
from mtpconv.weight_names import STORAGE

DRAFTER_GROUP = "mtpconv_fp8_drafter"
FP8_FORMAT = "float-quantized"
FP8_WEIGHTS: Mapping[str, Any] = {
    "num_bits": 8,
    "type": "float",
    "strategy": "channel",
    "symmetric": True,
    "dynamic": False,
}
FP8_INPUTS: Mapping[str, Any] = {
    "num_bits": 8,
    "type": "float",
    "strategy": "token",
    "symmetric": True,
    "dynamic": True,
}
_EXPERT_INDEX = re.compile(r"\\\.experts\\\.\d+\\\.")


@dataclass
class DrafterDeclaration:
    """What declaring the FP8 drafter changed in config.json's compressed-tensors config."""

    key: str  # the config's key path, e.g. "quantization_config"
    targets: list[str]  # the drafter group's targets
    removed_ignore: list[str] = field(default_factory=list)  # entries that skipped a drafter linear
    added_ignore: list[str] = field(default_factory=list)  # exact entries keeping other modules skipped


def declares_compressed_tensors(configs: QuantConfigs) -> bool:
    """Whether vLLM reads a compressed-tensors config for this checkpoint (and only that:
    a ModelOpt ``hf_quant_config.json`` beside it is left to the exclusion rewrite)."""
    decls = all_declarations(configs)
    return len(decls) == 1 and decls[0].method == methods.COMPRESSED_TENSORS


def with_declared_layouts(configs: QuantConfigs, linears: Iterable[Linear]) -> list[Linear]:
    """The drafter linears with the scale layout a compressed-tensors drafter group needs
    (``[out, 1]`` per channel; ``[E, out, 1]`` for a fused 3-D expert tensor), and the bit
    width the source's config declares where the weights' headers do not tell it; unchanged
    when the source is not compressed-tensors.

    Fused experts stay fused: vLLM's routed-experts loader (``RoutedExperts.load_weights``,
    ``include_fused``) splits a 3-D ``experts.gate_up_proj`` / ``experts.down_proj`` into
    ``w13_weight`` / ``w2_weight`` by replacing that name, so the channel scale stored as
    ``experts.gate_up_proj_scale`` reaches ``w13_weight_scale`` the same way and is split per
    expert and per half like the weight (non-block scales are never transposed).
    """
    linears = list(linears)
    if not declares_compressed_tensors(configs):
        return linears
    decl = all_declarations(configs)[0]
    return [
        replace(lin, declared_layout=ScaleLayout.PER_CHANNEL_COLUMN, **_declared_width(decl, lin))
        for lin in linears
    ]


def _declared_width(decl: DeclaredQuant, lin: Linear) -> dict[str, Any]:
    """A symmetric ``pack-quantized`` weight's bit width, which only its config group states
    (``num_bits``, as vLLM's ``CompressedTensorsWNA16`` reads it), and its unpacked shape."""
    if lin.bits is not None or lin.stored is not Stored.INT_CT:
        return {}
    algo = declared_algorithm(decl, lin.module) or ""
    if not algo.startswith("INT") or not algo[3:].isdigit():
        return {}
    bits = int(algo[3:])
    storage = STORAGE[lin.stored]
    return {"bits": bits, "shape": storage.logical({storage.weight: lin.shape}, bits)}


def asked_modules(modules: Iterable[str]) -> list[str]:
    """The names vLLM's compressed-tensors config is asked about for ``modules``, in order,
    each once: a routed-experts module by its expert-0 projections (`match.ct_expert_names`)."""
    return list(dict.fromkeys(n for m in modules for n in ct_expert_names(m)))


def _vllm_name(module: str) -> str:
    """The name vLLM matches a module's targets against (drafters are built under ``mtp.``)."""
    return drafter_alias(module) or module


def drafter_targets(fp8_linears: Collection[str], all_modules: Collection[str]) -> list[str]:
    """``re:`` targets matching exactly ``fp8_linears`` among ``all_modules``.

    One anchored regex per module; routed experts collapse to one regex per projection
    (``experts\\.\\d+\\.``) when that matches no other module.
    """
    wanted = {_vllm_name(m) for m in fp8_linears}
    others = ModuleSet(m for m in all_modules if _vllm_name(m) not in wanted)
    out: list[str] = []
    for name in sorted(wanted):
        exact = "re:^" + re.escape(name) + "$"
        collapsed = _EXPERT_INDEX.sub(r"\\.experts\\.\\d+\\.", exact)
        pick = exact
        if collapsed != exact and not ExclusionPattern(collapsed, methods.COMPRESSED_TENSORS).matches_any(
            others
        ):
            pick = collapsed
        if pick not in out:
            out.append(pick)
    return out


def _group(targets: list[str]) -> dict[str, Any]:
    return {
        "targets": targets,
        "weights": dict(FP8_WEIGHTS),
        "input_activations": dict(FP8_INPUTS),
        "output_activations": None,
        "format": FP8_FORMAT,
    }


def _body(config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    loc = quant_location(config)
    if loc is None:
        raise QuantConfigError("config.json declares no compressed-tensors quantization_config.")
    return loc.body, ".".join(loc.keys)


def _list_of(body: dict[str, Any], key: str, where: str) -> list[str]:
    value = body.get(key)
    if value is None:
        value = body[key] = []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise QuantConfigError(f"config.json {where}.{key} must be a list of strings; fix it by hand.")
    return value


def _reignore_entry(module: str) -> str:
    # Drafter modules by an anchored regex on their vLLM name (``mtp.``, never renamed);
    # target modules by their exact name (renamed by the mapper like their weights).
    if drafter_alias(module) is not None or module.startswith("mtp."):
        return "re:^" + re.escape(_vllm_name(module)) + "$"
    return module


def _algorithms(config: dict[str, Any], modules: Iterable[str]) -> dict[str, str | None]:
    decl: DeclaredQuant = all_declarations(QuantConfigs(config, None))[0]
    return {m: declared_algorithm(decl, m) for m in modules}


def declare_drafter_fp8(
    config: dict[str, Any], fp8_linears: Collection[str], all_modules: Collection[str]
) -> DrafterDeclaration:
    """Declare ``fp8_linears`` FP8 in ``config`` (edited in place); every other module of
    ``all_modules`` keeps exactly the declaration it had, every other key is kept.

    Raises `QuantConfigError` when that cannot be reached.
    """
    body, key = _body(config)
    fp8_linears = asked_modules(fp8_linears)
    all_modules = asked_modules(all_modules)
    others = sorted(set(all_modules) - set(fp8_linears))
    before = _algorithms(config, others)
    ignore = _list_of(body, "ignore", key)
    groups = body.get("config_groups")
    if groups is None:
        groups = body["config_groups"] = {}
    if not isinstance(groups, dict):
        raise QuantConfigError(f"config.json {key}.config_groups must be an object; fix it by hand.")
    targets = drafter_targets(fp8_linears, all_modules)
    done = DrafterDeclaration(key, targets)
    for entry in list(ignore):
        pattern = ExclusionPattern(entry, methods.COMPRESSED_TENSORS, f"config.json {key}.ignore")
        if any(pattern.matches(m) for m in fp8_linears):
            ignore.remove(entry)
            done.removed_ignore.append(entry)
    groups[DRAFTER_GROUP] = _group(targets)
    for module, algo in _algorithms(config, others).items():
        if algo != before[module] and before[module] is None:
            entry = _reignore_entry(module)
            if entry not in ignore:
                ignore.append(entry)
                done.added_ignore.append(entry)
    after = _algorithms(config, [*others, *fp8_linears])
    for module in others:
        if after[module] != before[module]:
            raise QuantConfigError(
                f"declaring the FP8 drafter in config.json {key} would change how {module} is "
                "declared; fix its ignore list or config_groups by hand."
            )
    for module in fp8_linears:
        if after[module] != methods.FP8:
            raise QuantConfigError(
                f"config.json {key} would still declare drafter linear {module} as "
                f"{after[module]}; fix its ignore list or config_groups by hand."
            )
    return done
