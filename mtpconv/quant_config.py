"""Read, audit and rewrite ``hf_quant_config.json`` + ``config.json``'s ``quantization_config``.

Names. A *module* is a checkpoint tensor name without its parameter suffix, exactly as
stored (``mtp.fc``, ``model.language_model.layers.3.mlp.gate``, ``lm_head``).

Which file wins. vLLM reads ``config.json``'s ``quantization_config`` (top level, else
``text_config.quantization_config``, else ``compression_config``) and falls back to
``hf_quant_config.json`` only when config.json declares nothing. `declared_quant` follows
that order; the rewriters always change both files, consistently.

Exclusion matching (ModelOpt), as vLLM 0.32 does it
(``vllm/model_executor/layers/quantization/modelopt.py``):

- ``ModelOptQuantConfigBase.apply_vllm_mapper`` rewrites every pattern ``x*`` whose
  next-to-last character is not ``.`` into the pair ``x`` and ``x.*`` (Qwen3.5 / Qwen3-Next
  model classes carry an ``hf_to_vllm_mapper``, so this always happens for them; the pair
  matches a superset of what ``x*`` alone matches, so using it is never less strict);
- ``is_layer_excluded`` then excludes a layer when a pattern equals its name, or is a
  substring of it, or ``fnmatch``-es it. Substring is why ``lm_head`` also excludes
  ``mtp.draft_lm_head``, and why ``mtp.layers.1*`` also excludes ``mtp.layers.10.*``.

vLLM matches its own layer prefixes, after mapping both the patterns and the weight names
through the *target* model's ``hf_to_vllm_mapper`` (e.g. ``model.language_model.`` ->
``language_model.model.``). Patterns and target names go through the same prefix table, so
for target modules matching in checkpoint-name space gives the same answer. Three things
differ, and `_vllm_view` models them:

- fused layers (``qkv_proj``, ``gate_up_proj``, ``in_proj_qkvz``, ``in_proj_ba``): substring
  and fnmatch see the fused name; only exact patterns are checked shard by shard, so
  ``*.q_proj`` excludes nothing while ``...self_attn.q_proj`` (exact) does;
- routed experts are one layer ``...mlp.experts``; ``is_layer_skipped`` skips a layer whose
  name contains "experts" when that name is a substring of any pattern containing
  "experts", so a single per-expert entry excludes the whole layer, while a glob that names
  one expert (``*.experts.0.up_proj``) excludes nothing;
- the MTP drafter: ``Qwen3_5MTP`` / ``Qwen3NextMTP`` are built with prefix ``mtp`` and share
  the target's (already mapped) quant-config object, so a drafter module is matched as
  ``mtp.<rest>`` even when stored as ``model.language_model.mtp.*`` (a pattern spelled
  ``model.language_model.mtp.fc`` is mapped to ``language_model.model.mtp.fc`` and misses
  it). Patterns we write for the drafter use the ``mtp.*`` form, which matches the stored
  name too.

``tests/test_quant_config.py`` checks this rule against vLLM's own ``is_layer_excluded``.

vLLM also keeps layers whose prefix contains ``vision_tower``, ``vision_model`` or
``vit_large_projector`` unquantized whatever the config says. ``MIXED_PRECISION`` layers
not excluded are quantized only when ``quantized_layers`` lists them (or a parent).
compressed-tensors ``ignore`` entries match exactly or as ``re:`` regexes (``re.match``);
the ``fp8`` method's ``ignored_layers`` / ``modules_to_not_convert`` match exactly.

Generated patterns are exact names of non-expert modules or subtree patterns ``P*`` on a
parent path (``.layers.*.`` wildcards only where no fused shard is singled out), each
verified against every module that must keep its declaration.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import translate
from functools import lru_cache
from pathlib import Path
from typing import Any

from mtpconv.errors import QuantConfigError
from mtpconv.findings import Finding, Severity
from mtpconv.jsonio import read_json
from mtpconv.names import VISION_MARKERS, drafter_alias

CONFIG_JSON = "config.json"
HF_QUANT_JSON = "hf_quant_config.json"

# Stable finding codes of `audit_quant_configs`:
#   plain-declared-quantized  stored plain, declared quantized (the mtp.fc gap): error;
#                             warning for Qwen MoE router gates, which vLLM never quantizes
#   quantized-declared-plain  stored NVFP4/FP8, excluded or not declared quantized: error
#   quant-format-mismatch     stored NVFP4 but declared FP8, or the reverse: error
#   quant-configs-disagree    config.json vs hf_quant_config.json differ (names the keys): warning
#   unused-exclusion          an exclusion pattern matches no module: info
#   quant-config-invalid      a config cannot be read (malformed keys): error
#   quant-method-unsupported  a quant_method whose exclusions mtpconv cannot audit: warning
CODE_PLAIN_DECLARED_QUANTIZED = "plain-declared-quantized"
CODE_QUANTIZED_DECLARED_PLAIN = "quantized-declared-plain"
CODE_FORMAT_MISMATCH = "quant-format-mismatch"
CODE_CONFIGS_DISAGREE = "quant-configs-disagree"
CODE_UNUSED_EXCLUSION = "unused-exclusion"
CODE_CONFIG_INVALID = "quant-config-invalid"
CODE_METHOD_UNSUPPORTED = "quant-method-unsupported"

FINDING_CODES = (
    CODE_PLAIN_DECLARED_QUANTIZED,
    CODE_QUANTIZED_DECLARED_PLAIN,
    CODE_FORMAT_MISMATCH,
    CODE_CONFIGS_DISAGREE,
    CODE_UNUSED_EXCLUSION,
    CODE_CONFIG_INVALID,
    CODE_METHOD_UNSUPPORTED,
)

# Router gates: vLLM's Qwen3-Next / Qwen3.5 MoE blocks build them with no quant config.
_ROUTER_GATES = (".mlp.gate", ".mlp.shared_expert_gate")
_HEAD_LEAVES = frozenset({"lm_head", "draft_lm_head", "head"})
_SUPPORTED_METHODS = ("modelopt", "compressed-tensors", "fp8", "none")


# --------------------------------------------------------------------------- loading


@dataclass
class QuantConfigs:
    """Both files as loaded, key order preserved."""

    config: dict[str, Any]
    hf_quant: dict[str, Any] | None
    config_path: Path | None = None
    hf_quant_path: Path | None = None


def load_quant_configs(directory: Path) -> QuantConfigs:
    """Load ``config.json`` (required) and ``hf_quant_config.json`` (optional) from a checkpoint."""
    directory = Path(directory)
    config_path = directory / CONFIG_JSON
    if not config_path.is_file():
        raise QuantConfigError(f"{config_path} is missing: a checkpoint directory needs its config.json.")
    config = read_json(config_path, QuantConfigError)
    hf_quant_path: Path | None = directory / HF_QUANT_JSON
    hf_quant: dict[str, Any] | None = None
    if hf_quant_path is not None and hf_quant_path.is_file():
        hf_quant = read_json(hf_quant_path, QuantConfigError)
    else:
        hf_quant_path = None
    return QuantConfigs(config=config, hf_quant=hf_quant, config_path=config_path,
                        hf_quant_path=hf_quant_path)  # fmt: skip


# --------------------------------------------------------------------- declarations


@dataclass
class DeclaredQuant:
    """What one quant config declares, normalised across the formats vLLM reads."""

    method: str  # "modelopt" | "compressed-tensors" | "fp8" | other quant_method | "none"
    algo: str | None  # "NVFP4" | "FP8" | "MIXED_PRECISION" | ... (upper case) or None
    exclude: list[str]
    quantized_layers: dict[str, str] | None  # MIXED_PRECISION: prefix -> algo
    kv_cache_algo: str | None
    source: str  # "config.json", "config.json (text_config)", "hf_quant_config.json", ""
    # compressed-tensors: (targets, algo) per config group, in file order.
    groups: list[tuple[list[str], str]] = field(default_factory=list)
    _matcher: _ExcludeMatcher | None = field(default=None, init=False, repr=False,
                                             compare=False)  # fmt: skip

    def matcher(self) -> _ExcludeMatcher:
        if self._matcher is None:
            self._matcher = _ExcludeMatcher(self.method, self.exclude, self.source)
        return self._matcher


def _where(configs_source: str, key: str) -> str:
    return f"{configs_source} key {key!r}"


def _str_or_none(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    raise QuantConfigError(f"{where} must be a string, found {type(value).__name__}.")


def _str_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise QuantConfigError(f"{where} must be a list of strings; fix the file by hand.")
    return list(value)


def _quantized_layers(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise QuantConfigError(f"{where} must be an object of prefix -> settings.")
    out: dict[str, str] = {}
    for prefix, info in value.items():
        algo = info.get("quant_algo") if isinstance(info, dict) else None
        if not isinstance(algo, str):
            raise QuantConfigError(f"{where}[{prefix!r}] needs a string 'quant_algo'.")
        out[prefix] = algo.upper()
    return out


def _kv_from_scheme(scheme: Any) -> str | None:
    if isinstance(scheme, dict):
        if scheme.get("type") == "float" and scheme.get("num_bits") == 8:
            return "FP8"
        return None
    if isinstance(scheme, str):
        return scheme.upper()
    return None


def _config_quant_location(config: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """Where config.json declares quantization, as vLLM looks for it."""
    qc = config.get("quantization_config")
    if qc is not None:
        if not isinstance(qc, dict):
            raise QuantConfigError("config.json 'quantization_config' must be an object.")
        return ("quantization_config",), qc
    text = config.get("text_config")
    if isinstance(text, dict) and text.get("quantization_config") is not None:
        qc = text["quantization_config"]
        if not isinstance(qc, dict):
            raise QuantConfigError("config.json 'text_config.quantization_config' must be an object.")
        return ("text_config", "quantization_config"), qc
    cc = config.get("compression_config")
    if cc is not None:
        if not isinstance(cc, dict):
            raise QuantConfigError("config.json 'compression_config' must be an object.")
        return ("compression_config",), cc
    return None


def _source_name(path: tuple[str, ...]) -> str:
    if path[0] == "text_config":
        return "config.json (text_config)"
    if path[0] == "compression_config":
        return "config.json (compression_config)"
    return CONFIG_JSON


def _modelopt_from_quantization(q: Any, source: str) -> DeclaredQuant:
    """The ``{"quant_algo", "exclude_modules", ...}`` body of hf_quant_config.json."""
    if not isinstance(q, dict):
        raise QuantConfigError(f"{_where(source, 'quantization')} must be an object.")
    algo = _str_or_none(q.get("quant_algo"), _where(source, "quant_algo"))
    kv = q.get("kv_cache_quant_algo")
    kv_algo = _str_or_none(kv, _where(source, "kv_cache_quant_algo"))
    exclude = _str_list(q.get("exclude_modules"), _where(source, "exclude_modules"))
    algo_u = algo.upper() if algo else None
    layers = None
    if algo_u == "MIXED_PRECISION":
        layers = _quantized_layers(q.get("quantized_layers"), _where(source, "quantized_layers"))
    return DeclaredQuant("modelopt", algo_u, exclude, layers, kv_algo.upper() if kv_algo else None,
                         source)  # fmt: skip


def _modelopt_from_qc(qc: dict[str, Any], source: str,
                      hf_quant: dict[str, Any] | None) -> DeclaredQuant:  # fmt: skip
    if "quantization" in qc:
        return _modelopt_from_quantization(qc["quantization"], source)
    algo = _str_or_none(qc.get("quant_algo"), _where(source, "quant_algo"))
    exclude = _str_list(qc.get("ignore"), _where(source, "ignore"))
    algo_u = algo.upper() if algo else None
    layers = None
    if algo_u == "MIXED_PRECISION":
        raw = qc.get("quantized_layers")
        if raw is None and hf_quant is not None and isinstance(hf_quant.get("quantization"), dict):
            # vLLM falls back to hf_quant_config.json for the per-layer map.
            raw = hf_quant["quantization"].get("quantized_layers")
        layers = _quantized_layers(raw, _where(source, "quantized_layers"))
    kv = _kv_from_scheme(qc.get("kv_cache_scheme"))
    return DeclaredQuant("modelopt", algo_u, exclude, layers, kv, source)


def _ct_algo(scheme: Any) -> str | None:
    if not isinstance(scheme, dict):
        return None
    weights = scheme.get("weights")
    if not isinstance(weights, dict):
        return None
    bits, kind = weights.get("num_bits"), weights.get("type")
    if kind == "float" and bits == 4:
        return "NVFP4"
    if kind == "float" and bits == 8:
        return "FP8"
    if kind == "int" and isinstance(bits, int):
        return f"INT{bits}"
    return None


def _compressed_tensors(qc: dict[str, Any], source: str) -> DeclaredQuant:
    ignore = _str_list(qc.get("ignore"), _where(source, "ignore"))
    groups: list[tuple[list[str], str]] = []
    raw = qc.get("config_groups")
    if isinstance(raw, dict):
        for name, scheme in raw.items():
            algo = _ct_algo(scheme)
            targets = scheme.get("targets") if isinstance(scheme, dict) else None
            tlist = _str_list(targets, _where(source, f"config_groups.{name}.targets"))
            if algo is not None:
                groups.append((tlist, algo))
    algos = {a for _, a in groups}
    algo = next(iter(algos)) if len(algos) == 1 else ("MIXED" if algos else None)
    kv = _kv_from_scheme(qc.get("kv_cache_scheme"))
    return DeclaredQuant("compressed-tensors", algo, ignore, None, kv, source, groups)


def _declared_from_qc(qc: dict[str, Any], source: str,
                      hf_quant: dict[str, Any] | None) -> DeclaredQuant:  # fmt: skip
    method_raw = _str_or_none(qc.get("quant_method"), _where(source, "quant_method"))
    method = (method_raw or "").lower()
    if method.startswith("modelopt") or (not method and "quantization" in qc):
        return _modelopt_from_qc(qc, source, hf_quant)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, source)
    if method == "fp8":
        ignored = _str_list(qc.get("ignored_layers"), _where(source, "ignored_layers"))
        if not ignored:
            ignored = _str_list(qc.get("modules_to_not_convert"),
                                _where(source, "modules_to_not_convert"))  # fmt: skip
        return DeclaredQuant("fp8", "FP8", ignored, None, None, source)
    if not method:
        raise QuantConfigError(f"{source} has a quantization config without 'quant_method'.")
    return DeclaredQuant(method, None, [], None, None, source)


def _declared_from_hf_quant(hf_quant: dict[str, Any]) -> DeclaredQuant:
    if "quantization" not in hf_quant:
        raise QuantConfigError(f"{HF_QUANT_JSON} has no 'quantization' object; restore the original file.")
    return _modelopt_from_quantization(hf_quant["quantization"], HF_QUANT_JSON)


def _all_declarations(configs: QuantConfigs) -> list[DeclaredQuant]:
    """Every declaration present: config.json's first (what vLLM reads), then the fallback."""
    out: list[DeclaredQuant] = []
    loc = _config_quant_location(configs.config)
    if loc is not None:
        out.append(_declared_from_qc(loc[1], _source_name(loc[0]), configs.hf_quant))
    if configs.hf_quant is not None:
        out.append(_declared_from_hf_quant(configs.hf_quant))
    return out


def declared_quant(configs: QuantConfigs) -> DeclaredQuant:
    """What vLLM will read: config.json's quantization config, else hf_quant_config.json."""
    decls = _all_declarations(configs)
    if decls:
        return decls[0]
    return DeclaredQuant("none", None, [], None, None, "")


# ------------------------------------------------------------------------- matching


def _expand_pattern(pattern: str) -> tuple[str, ...]:
    """vLLM's ``apply_vllm_mapper``: ``x*`` -> ``x`` and ``x.*`` (not for ``x.*``)."""
    if len(pattern) >= 2 and pattern[-1] == "*" and pattern[-2] != ".":
        return (pattern[:-1], pattern[:-1] + ".*")
    return (pattern,)


# vLLM (Qwen3.5 / Qwen3-Next ``packed_modules_mapping``) fuses these checkpoint leaves.
_FUSED_INTO = {
    "q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj",
    "in_proj_qkv": "in_proj_qkvz", "in_proj_z": "in_proj_qkvz",
    "in_proj_a": "in_proj_ba", "in_proj_b": "in_proj_ba",
}  # fmt: skip


@lru_cache(maxsize=1 << 18)
def _vllm_view(module: str) -> tuple[str, str]:
    """``(shard, layer)``: the names vLLM matches a checkpoint module under.

    ``layer`` is the vLLM layer prefix (fused leaf, or ``...experts`` for a routed expert);
    ``shard`` is the unfused name vLLM compares *exact* patterns with. A VLM-prefixed
    drafter module is seen as ``mtp.<rest>`` (the MTP classes are built with prefix mtp).
    """
    base = drafter_alias(module) or module
    parts = base.split(".")
    if "experts" in parts[:-1]:
        layer = ".".join(parts[: parts.index("experts") + 1])
        return layer, layer
    fused = _FUSED_INTO.get(parts[-1])
    if fused is None:
        return base, base
    return base, ".".join([*parts[:-1], fused])


class _OnePattern:
    """One exclusion pattern compiled for the method's matching rule."""

    __slots__ = ("pattern", "_forms", "_expert_forms", "_literals", "_regexes", "_exact")

    def __init__(self, pattern: str, method: str, source: str) -> None:
        self.pattern = pattern
        self._forms: tuple[str, ...] = (pattern,)
        self._literals: tuple[str, ...] = ()
        self._regexes: tuple[re.Pattern[str], ...] = ()
        self._exact = False
        if method == "modelopt":
            self._forms = _expand_pattern(pattern)
            self._literals = self._forms  # exact match on the layer is implied by substring
            self._regexes = tuple(re.compile(translate(f)) for f in self._forms if _is_glob(f))
        elif method == "compressed-tensors" and pattern.startswith("re:"):
            try:
                self._regexes = (re.compile(pattern[3:]),)
            except re.error as exc:
                raise QuantConfigError(
                    f"{source} ignore entry {pattern!r} is not a valid regex ({exc})."
                ) from exc
        else:
            self._exact = True
        # vLLM's exact stage (``is_layer_skipped``) treats a layer whose name contains
        # "experts" specially: it is skipped when it is a substring of any pattern that
        # contains "experts", so one per-expert entry excludes the whole routed-experts
        # layer. compressed-tensors uses its own matcher without this rule.
        self._expert_forms: tuple[str, ...] = ()
        if method != "compressed-tensors":
            self._expert_forms = tuple(f for f in self._forms if "experts" in f)

    def matches(self, module: str) -> bool:
        shard, layer = _vllm_view(module)
        if not self._regex_only and (shard in self._forms or layer in self._forms):
            return True  # exact, on the layer or (vLLM's shard expansion) on the shard
        if _expert_rule_applies(shard, layer) and any(layer in f for f in self._expert_forms):
            return True
        if self._exact:
            return False
        if any(lit in layer for lit in self._literals):
            return True  # ModelOpt substring
        # ModelOpt fnmatch-es the layer; compressed-tensors re.match-es layer, then shards.
        names = (layer,) if self._literals or shard == layer else (layer, shard)
        return any(rx.match(n) for rx in self._regexes for n in names)

    @property
    def _regex_only(self) -> bool:
        return self.pattern.startswith("re:") and not self._literals


def _expert_rule_applies(shard: str, layer: str) -> bool:
    return shard == layer and "experts" in layer  # not a fused shard, "experts" in the name


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _trie_regex(words: Iterable[str]) -> str:
    """One regex matching any of ``words``, factored by common prefixes: a plain
    alternation of ~200 paths costs ~20 us per search, the trie form ~1 us."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        if "" in node and len(node) == 1:
            return ""
        optional = "" in node
        branches = [re.escape(ch) + emit(child) for ch, child in node.items() if ch]
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if optional:  # a word ends here: the rest is not needed for a match
            return ""
        return body

    return emit(trie)


class _ExcludeMatcher:
    """All exclusion patterns of one declaration; ``excluded`` is one or two C-level regex
    calls per name, so auditing ~100k modules against ~200 patterns stays fast."""

    def __init__(self, method: str, patterns: Iterable[str], source: str) -> None:
        self.patterns = [_OnePattern(p, method, source) for p in patterns]
        self._exact_forms = frozenset(f for p in self.patterns if not p._regex_only for f in p._forms)
        self._expert_forms = [f for p in self.patterns for f in p._expert_forms]
        literals = sorted({lit for p in self.patterns for lit in p._literals}, key=len)
        self._literal_rx = re.compile(_trie_regex(literals)) if literals else None
        self._regexes = [rx for p in self.patterns for rx in p._regexes]
        self._glob_rx = None
        if method == "modelopt" and self._regexes:
            # fnmatch.translate output is self-contained ((?s:...)\Z), safe to alternate.
            self._glob_rx = re.compile("|".join(f"(?:{rx.pattern})" for rx in self._regexes))

    def matching(self, module: str) -> list[str]:
        return [p.pattern for p in self.patterns if p.matches(module)]

    def excluded(self, module: str) -> bool:
        shard, layer = _vllm_view(module)
        if shard in self._exact_forms or layer in self._exact_forms:
            return True
        if _expert_rule_applies(shard, layer) and any(layer in f for f in self._expert_forms):
            return True
        if self._literal_rx is not None and self._literal_rx.search(layer):
            return True
        if self._glob_rx is not None:
            return self._glob_rx.match(layer) is not None
        names = (layer,) if shard == layer else (layer, shard)
        return any(rx.match(n) for rx in self._regexes for n in names)


def pattern_matches(pattern: str, module: str, *, method: str = "modelopt") -> bool:
    """Whether one exclusion pattern excludes ``module`` under vLLM's rule for ``method``."""
    return _OnePattern(pattern, method, "pattern").matches(module)


def _mixed_candidates(module: str) -> list[str]:
    """The names vLLM's ``_quantized_layer_prefix_candidates`` tries for a module."""
    base = drafter_alias(module) or module
    cands = [base]
    for prefix_a, prefix_b in (
        ("model.language_model.", "language_model.model."),
        ("language_model.model.", "model.language_model."),
    ):
        if base.startswith(prefix_a):
            cands.append(prefix_b + base[len(prefix_a) :])
    if base.endswith(".lm_head"):
        cands.append("lm_head")
    return cands


def _mixed_keys(layers: Mapping[str, Any], module: str) -> list[str]:
    """Every ``quantized_layers`` key that applies to ``module``, most specific first: an
    entry for the module itself, then for a parent (``...mlp.experts`` covers
    ``...mlp.experts.3.up_proj``) — vLLM's ``_resolve_quant_algo`` in checkpoint names."""
    cands = _mixed_candidates(module)
    keys = [c for c in cands if c in layers]
    for cand in cands:
        parts = cand.split(".")
        keys += [p for k in range(len(parts) - 1, 0, -1) if (p := ".".join(parts[:k])) in layers]
    return keys


def _mixed_lookup(layers: Mapping[str, str], module: str) -> str | None:
    keys = _mixed_keys(layers, module)
    return layers[keys[0]] if keys else None


def _ct_target_matches(target: str, module: str) -> bool:
    if target == "Linear":
        # class-name target: every linear layer, but not an LM head (vLLM builds those as
        # ParallelLMHead, whose class name is not "Linear")
        return module.rsplit(".", 1)[-1] not in _HEAD_LEAVES
    if target.startswith("re:"):
        try:
            return re.match(target[3:], module) is not None
        except re.error:
            return False
    return target == module


def declared_format(decl: DeclaredQuant, module: str) -> str | None:
    """The algo ``decl`` declares for ``module`` ("NVFP4", "FP8", ...); None = unquantized."""
    if decl.method == "none":
        return None
    if decl.matcher().excluded(module):
        return None
    if decl.method == "modelopt":
        if any(marker in module for marker in VISION_MARKERS):
            return None
        if decl.algo == "MIXED_PRECISION":
            return _mixed_lookup(decl.quantized_layers or {}, module)
        return decl.algo
    if decl.method == "compressed-tensors":
        for targets, algo in decl.groups:
            if any(_ct_target_matches(t, module) for t in targets):
                return algo
        return None
    return decl.algo or decl.method.upper()


_NVFP4_ALGOS = frozenset({"NVFP4", "W4A16_NVFP4", "NVFP4_AWQ", "NVFP4_SVD", "W4A8_NVFP4_FP8"})


def storage_format(algo: str | None) -> str | None:
    """The stored format ("nvfp4" | "fp8") an algo implies; None when unknown or unquantized."""
    if algo is None:
        return None
    a = algo.upper()
    if a in _NVFP4_ALGOS:
        return "nvfp4"
    if a.startswith("FP8"):
        return "fp8"
    return None


# ---------------------------------------------------------------------------- audit


def _disagreements(a: DeclaredQuant, b: DeclaredQuant) -> list[str]:
    keys: list[str] = []
    if a.method != b.method:
        keys.append("quant_method")
    if a.algo != b.algo:
        keys.append("quant_algo")
    if set(a.exclude) != set(b.exclude):
        keys.append("ignore / exclude_modules")
    if a.kv_cache_algo != b.kv_cache_algo:
        keys.append("kv_cache_scheme / kv_cache_quant_algo")
    if (a.quantized_layers or {}) != (b.quantized_layers or {}):
        keys.append("quantized_layers")
    return keys


def _unused_patterns(decl: DeclaredQuant, universe: list[str]) -> list[_OnePattern]:
    """Patterns of ``decl`` that match no module of ``universe``."""
    if decl.method == "none":
        return []
    views = {_vllm_view(m) for m in universe}
    layers = sorted({layer for _, layer in views})
    names = sorted({n for view in views for n in view})
    # Literals never contain a newline, so a substring hit in the joined text is a hit in
    # one name; this keeps the check linear for ~100k modules.
    text = "\n".join(layers)
    exact = set(names)
    expert_layers = [layer for shard, layer in views if _expert_rule_applies(shard, layer)]
    unused = []
    for pat in decl.matcher().patterns:
        exact_hit = not pat._regex_only and any(f in exact for f in pat._forms)
        expert_hit = any(layer in f for f in pat._expert_forms for layer in expert_layers)
        if exact_hit or expert_hit:
            hit = True
        elif pat._exact:
            hit = False
        else:
            hit = any(lit in text for lit in pat._literals) or any(
                rx.match(n) for rx in pat._regexes for n in (layers if pat._literals else names)
            )
        if not hit:
            unused.append(pat)
    return unused


def _vllm_consequence_plain(module: str, algo: str) -> str:
    fails = (
        f"vLLM will build an {algo} layer for it and fail to load the unquantized weight "
        "(shape/dtype mismatch)"
    )
    if module.endswith("mtp.fc") and storage_format(algo) == "nvfp4":
        return (
            "vLLM 0.32 loads it only through a hard-coded exception for Qwen3.5/Qwen3-Next "
            f"mtp.fc under NVFP4; without that exception (other versions, runtimes or quant "
            f"algos) {fails}"
        )
    return fails


def audit_quant_configs(
    configs: QuantConfigs,
    stored: Mapping[str, str],
    drafter_modules: Collection[str],
    *,
    all_modules: Collection[str] = (),
    plugin_drafter: bool = False,
) -> list[Finding]:
    """Compare what the configs declare with what the tensors are.

    ``stored`` maps every linear-ish module to "nvfp4" | "fp8" | "plain".
    ``all_modules`` (optional) widens the set used to decide whether an exclusion pattern
    matches anything. ``plugin_drafter``: the checkpoint is an mtpconv variant whose FP8
    drafter is served by the mtpconv plugin, so drafter modules stored FP8 and excluded
    are expected.
    """
    try:
        decls = _all_declarations(configs)
    except QuantConfigError as exc:
        return [Finding(Severity.ERROR, CODE_CONFIG_INVALID, "", str(exc))]
    decl = decls[0] if decls else DeclaredQuant("none", None, [], None, None, "")
    findings: list[Finding] = []
    if decl.method not in _SUPPORTED_METHODS:
        findings.append(Finding(
            Severity.WARNING, CODE_METHOD_UNSUPPORTED, "",
            f"{decl.source} declares quant_method {decl.method!r}; mtpconv cannot audit its "
            "exclusions, so no per-module check was made.",
        ))  # fmt: skip
        return findings
    drafter = set(drafter_modules)
    where = decl.source or "no quantization config"
    for module in sorted(stored):
        kind = stored[module]
        try:
            algo = declared_format(decl, module)
        except QuantConfigError as exc:
            return [Finding(Severity.ERROR, CODE_CONFIG_INVALID, "", str(exc))]
        fmt = storage_format(algo)
        if kind == "plain" and algo is not None:
            router = module.endswith(_ROUTER_GATES)
            consequence = (
                "vLLM 0.32 builds Qwen MoE router gates without quantization, so it loads, "
                "but other runtimes follow the config"
                if router
                else _vllm_consequence_plain(module, algo)
            )
            findings.append(Finding(
                Severity.WARNING if router else Severity.ERROR,
                CODE_PLAIN_DECLARED_QUANTIZED, module,
                f"{module} is stored unquantized but {where} declares it {algo}: "
                f"{consequence}. Run `mtpconv fix-exclusions` to exclude it in both config "
                "files.",
            ))  # fmt: skip
        elif kind in ("nvfp4", "fp8") and algo is None:
            if plugin_drafter and module in drafter and kind == "fp8":
                continue
            matched = decl.matcher().matching(module) if decl.method != "none" else []
            why = (f"excluded by {', '.join(repr(p) for p in matched)}" if matched
                   else "not declared quantized")  # fmt: skip
            extra = (" An mtpconv -mtpfp8 drafter needs the mtpconv vLLM plugin."
                     if module in drafter and kind == "fp8" else "")  # fmt: skip
            findings.append(Finding(
                Severity.ERROR, CODE_QUANTIZED_DECLARED_PLAIN, module,
                f"{module} is stored {kind.upper()} but {where} has it {why}: stock vLLM will "
                f"build an unquantized layer and fail to load (or misread) the packed weight."
                f"{extra}",
            ))  # fmt: skip
        elif kind in ("nvfp4", "fp8") and fmt is not None and fmt != kind:
            findings.append(Finding(
                Severity.ERROR, CODE_FORMAT_MISMATCH, module,
                f"{module} is stored {kind.upper()} but {where} declares it {algo}: vLLM will "
                "create the wrong weight layout and fail to load it.",
            ))  # fmt: skip
    if len(decls) == 2:
        keys = _disagreements(decls[0], decls[1])
        if keys:
            findings.append(Finding(
                Severity.WARNING, CODE_CONFIGS_DISAGREE, "",
                f"{decls[0].source} and {HF_QUANT_JSON} disagree on {', '.join(keys)}; vLLM "
                f"reads {decls[0].source}, other tools may read {HF_QUANT_JSON}.",
            ))  # fmt: skip
    universe = list(dict.fromkeys([*stored, *all_modules]))
    for pat in _unused_patterns(decl, universe):
        findings.append(Finding(
                Severity.INFO, CODE_UNUSED_EXCLUSION, "",
                f"exclusion {pat.pattern!r} in {decl.source} matches no module of this "
                "checkpoint.",
            ))  # fmt: skip
    return findings


# ------------------------------------------------------------------------ rewriting


def _candidates(module: str, method: str) -> list[str]:
    """Patterns that could exclude ``module`` safely in vLLM, most general first."""
    name = drafter_alias(module) or module
    parts = name.split(".")
    leaf = parts[-1]
    expert_at = parts.index("experts") if "experts" in parts[:-1] else None
    if method == "fp8" or method == "compressed-tensors":
        # Exact names only; routed experts are one vLLM layer named "...experts".
        if expert_at is not None:
            return [".".join(parts[: expert_at + 1])]
        return [name]
    out: list[str] = []
    deepest = len(parts) - 1 if expert_at is None else expert_at + 1
    for k in range(1, deepest + 1):
        prefix = ".".join(parts[:k])
        out.append(prefix + "*")
        generic = re.sub(r"\.layers\.\d+(?=\.|$)", ".layers.*", prefix)
        if generic != prefix:
            out.append(generic + "*")
    if expert_at is None:
        out.append(name)  # exact: vLLM expands fused layers to their shards for these
        generic = re.sub(r"\.layers\.\d+\.", ".layers.*.", name)
        if generic != name and leaf not in _FUSED_INTO:  # a glob never sees shard names
            out.append(generic)
    return out


def _minimal_patterns(targets: Collection[str], forbidden: Collection[str],
                      method: str) -> list[str]:  # fmt: skip
    """A small set of patterns that together match every target and no forbidden module.

    Greedy set cover over the candidates of `_candidates`, each verified against every
    forbidden module with the real matching rule.
    """
    todo = list(dict.fromkeys(targets))
    if not todo:
        return []
    cover: dict[str, set[str]] = {}
    for module in todo:
        for cand in _candidates(module, method):
            cover.setdefault(cand, set())
    compiled = {c: _OnePattern(c, method, "generated") for c in cover}
    for cand, pat in compiled.items():
        cover[cand] = {m for m in todo if pat.matches(m)}
    forbidden_list = list(dict.fromkeys(forbidden))
    unsafe: set[str] = set()
    chosen: list[str] = []
    left = set(todo)
    while left:
        ranked = sorted(
            (c for c in cover if c not in unsafe and cover[c] & left),
            # Most targets first; among equals the most specific pattern (deepest path,
            # exact before subtree), so a single module gets its own name, not a subtree.
            key=lambda c: (-len(cover[c] & left), -c.count("."), c.endswith("*"), len(c), c),
        )
        pick = None
        for cand in ranked:
            pat = compiled[cand]
            if any(pat.matches(f) for f in forbidden_list):
                unsafe.add(cand)
                continue
            pick = cand
            break
        if pick is None:
            stuck = sorted(left)[0]
            raise QuantConfigError(
                f"no exclusion pattern excludes {stuck} without also excluding a module that "
                "must stay quantized; fix the exclusion list by hand."
            )
        chosen.append(pick)
        left -= cover[pick]
    return chosen


def _ensure_list(container: dict[str, Any], key: str, where: str) -> list[str]:
    value = container.get(key)
    if value is None:
        value = []
        container[key] = value
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise QuantConfigError(f"{where} key {key!r} must be a list of strings.")
    return value


def _exclusion_lists(hf_quant: dict[str, Any] | None, config: dict[str, Any],
                     method: str) -> list[list[str]]:  # fmt: skip
    """The (mutable) exclusion lists of both documents, created where missing."""
    lists: list[list[str]] = []
    loc = _config_quant_location(config)
    if loc is not None:
        qc = loc[1]
        source = _source_name(loc[0])
        if method == "modelopt" and isinstance(qc.get("quantization"), dict):
            lists.append(_ensure_list(qc["quantization"], "exclude_modules", source))
        elif method == "fp8":
            key = (
                "ignored_layers"
                if qc.get("ignored_layers") or not qc.get("modules_to_not_convert")
                else "modules_to_not_convert"
            )
            lists.append(_ensure_list(qc, key, source))
        else:
            lists.append(_ensure_list(qc, "ignore", source))
    if hf_quant is not None:
        q = hf_quant.get("quantization")
        if not isinstance(q, dict):
            raise QuantConfigError(f"{HF_QUANT_JSON} has no 'quantization' object.")
        lists.append(_ensure_list(q, "exclude_modules", HF_QUANT_JSON))
    return lists


def _decls_of(hf_quant: dict[str, Any] | None, config: dict[str, Any]) -> list[DeclaredQuant]:
    return _all_declarations(QuantConfigs(config=config, hf_quant=hf_quant))


def _quantized_anywhere(decls: list[DeclaredQuant], module: str) -> bool:
    return any(declared_format(d, module) is not None for d in decls)


def _add_exclusions(hf_quant: dict[str, Any] | None, config: dict[str, Any],
                    targets: Collection[str], forbidden: Collection[str]) -> None:  # fmt: skip
    """Append minimal patterns excluding ``targets`` (and no ``forbidden``) to both files."""
    decls = _decls_of(hf_quant, config)
    need = [m for m in targets if _quantized_anywhere(decls, m)]
    if not need:
        return
    methods = {d.method for d in decls}
    if not methods <= {"modelopt", "compressed-tensors", "fp8"}:
        raise QuantConfigError(
            f"cannot rewrite exclusions of quant_method {sorted(methods)}; only ModelOpt, "
            "compressed-tensors and fp8 configs are supported."
        )
    # Generate for the strictest rule in play (exact-only beats glob).
    method = "modelopt" if methods == {"modelopt"} else sorted(methods - {"modelopt"})[0]
    patterns = _minimal_patterns(need, forbidden, method)
    for lst in _exclusion_lists(hf_quant, config, decls[0].method):
        for pat in patterns:
            if pat not in lst:
                lst.append(pat)
    after = _decls_of(hf_quant, config)
    still = [m for m in need if _quantized_anywhere(after, m)]
    if still:
        raise QuantConfigError(
            f"could not exclude {still[0]} with the generated patterns {patterns}; "
            "fix the exclusion list by hand."
        )


def _copy_docs(configs: QuantConfigs) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    if not isinstance(configs.config, dict):
        raise QuantConfigError("config.json must hold a JSON object.")
    if configs.hf_quant is not None and not isinstance(configs.hf_quant, dict):
        raise QuantConfigError(f"{HF_QUANT_JSON} must hold a JSON object.")
    return copy.deepcopy(configs.hf_quant), copy.deepcopy(configs.config)


def _drop_drafter_layers(hf_quant: dict[str, Any] | None, config: dict[str, Any],
                         drafter: set[str], others: set[str]) -> None:  # fmt: skip
    """MIXED_PRECISION: remove quantized_layers entries that cover only drafter modules."""

    def prune(layers: Any) -> list[str]:
        if not isinstance(layers, dict):
            return []
        mine = {k for m in drafter for k in _mixed_keys(layers, m)}
        theirs = {k for m in others for k in _mixed_keys(layers, m)}
        gone = [k for k in layers if k in mine and k not in theirs]
        for k in gone:
            del layers[k]
        return gone

    loc = _config_quant_location(config)
    if loc is not None:
        qc = loc[1]
        body = qc["quantization"] if isinstance(qc.get("quantization"), dict) else qc
        gone = set(prune(body.get("quantized_layers")))
        groups = qc.get("config_groups")
        if gone and isinstance(groups, dict):
            for name in list(groups):
                group = groups[name]
                targets = group.get("targets") if isinstance(group, dict) else None
                if isinstance(targets, list) and any(t in gone for t in targets):
                    group["targets"] = [t for t in targets if t not in gone]
                    if not group["targets"]:
                        del groups[name]
    if hf_quant is not None and isinstance(hf_quant.get("quantization"), dict):
        prune(hf_quant["quantization"].get("quantized_layers"))


def variant_configs(
    configs: QuantConfigs,
    drafter_modules: Collection[str],
    all_modules: Collection[str],
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """New ``(hf_quant_config, config)`` for the -mtpfp8 variant.

    The whole drafter is declared unquantized by the target's config (MIXED_PRECISION:
    drafter entries leave ``quantized_layers``; otherwise minimal exclusion patterns are
    appended to both files), no other module changes declaration, every other key, value
    and order is kept. ``all_modules`` is every module of the checkpoint (target and
    drafter); generated patterns are verified against it. A source without a quant config
    comes back unchanged (no ``quantization_config`` is added).
    """
    hf_quant, config = _copy_docs(configs)
    decls = _decls_of(hf_quant, config)
    if not decls:
        return hf_quant, config
    drafter = set(drafter_modules)
    others = {m for m in all_modules if m not in drafter}
    before = {m: [declared_format(d, m) for d in decls] for m in others}
    if any(d.algo == "MIXED_PRECISION" for d in decls):
        _drop_drafter_layers(hf_quant, config, drafter, others)
    pruned = _decls_of(hf_quant, config)
    forbidden = {m for m in others if _quantized_anywhere(pruned, m)}
    _add_exclusions(hf_quant, config, sorted(drafter), forbidden)
    after_decls = _decls_of(hf_quant, config)
    for m in sorted(others):
        if [declared_format(d, m) for d in after_decls] != before[m]:
            raise QuantConfigError(
                f"rewriting the exclusions would change how {m} is declared; fix the exclusion list by hand."
            )
    return hf_quant, config


def fixed_exclusion_configs(
    configs: QuantConfigs,
    stored: Mapping[str, str],
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Only the exclusion fix: every module stored "plain" but declared quantized becomes
    excluded in both files (minimal patterns verified against ``stored``); nothing else
    changes."""
    hf_quant, config = _copy_docs(configs)
    decls = _decls_of(hf_quant, config)
    if not decls:
        return hf_quant, config
    targets = [m for m, kind in stored.items() if kind == "plain" and _quantized_anywhere(decls, m)]
    if not targets:
        return hf_quant, config
    tset = set(targets)
    forbidden = {m for m in stored if m not in tset and _quantized_anywhere(decls, m)}
    _add_exclusions(hf_quant, config, targets, forbidden)
    return hf_quant, config
