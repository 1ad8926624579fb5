"""vLLM's exclusion rule, written once: which patterns exclude which modules.

Names. A *module* is a checkpoint tensor name without its parameter suffix, exactly as
stored (``mtp.fc``, ``model.language_model.layers.3.mlp.gate``, ``lm_head``).

ModelOpt, as vLLM 0.32 does it (``vllm/model_executor/layers/quantization/modelopt.py``):

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
differ, and `vllm_view` models them:

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

compressed-tensors, as vLLM 0.32 does it (``compressed_tensors/utils.py``
``should_ignore_layer`` -> ``utils/config_utils.py`` ``find_matching_patterns``): ``ignore``
entries match exactly or as ``re:`` regexes (``re.match``), first against the (fused) layer
name, then shard by shard (all shards must agree, else vLLM raises); no substring, no
fnmatch, no "experts" rule. Routed experts differ from ModelOpt: ``CompressedTensorsMoEMethod``
looks the whole ``...mlp.experts`` layer up as ``...mlp.experts.0.{gate,up,down}_proj``, so
an entry ``...mlp.experts`` excludes nothing, and expert 0's entries decide for every
expert (`vllm_view` with the method gives that name). The ``fp8`` method's
``ignored_layers`` / ``modules_to_not_convert`` match exactly (``is_layer_skipped``, with
ModelOpt's "experts" rule).
``tests/quantconfig/test_vllm_oracle.py`` checks this rule against vLLM's own
``is_layer_excluded``.

One rule, three questions: `ExclusionPattern.matches` (one pattern, one module),
`ExclusionMatcher.excludes` (all patterns, one module: the fast path for ~100k modules)
and `ExclusionPattern.matches_any` (one pattern, a whole `ModuleSet`: the audit's unused
patterns and the rewrite's safety check). All three run `_rule_hits`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import translate
from functools import lru_cache
from typing import Any, Protocol

from mtpconv.errors import QuantConfigError
from mtpconv.names import drafter_alias
from mtpconv.quantconfig import methods

# vLLM (Qwen3.5 / Qwen3-Next ``packed_modules_mapping``) fuses these checkpoint leaves.
FUSED_INTO = {
    "q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj",
    "in_proj_qkv": "in_proj_qkvz", "in_proj_z": "in_proj_qkvz",
    "in_proj_a": "in_proj_ba", "in_proj_b": "in_proj_ba",
}  # fmt: skip


# A fused 3-D routed-experts tensor's leaf -> the per-expert projections it holds.
_FUSED_EXPERT_PROJECTIONS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


def _is_fused_expert(parts: list[str]) -> bool:
    return len(parts) >= 2 and parts[-2] == "experts" and parts[-1] in _FUSED_EXPERT_PROJECTIONS


def ct_expert_names(name: str) -> tuple[str, ...]:
    """The names vLLM's compressed-tensors MoE method looks a routed-experts module up by:
    ``...experts.N.proj`` -> ``...experts.0.proj``; a fused 3-D ``...experts.gate_up_proj`` ->
    ``...experts.0.gate_proj`` and ``...experts.0.up_proj`` (``down_proj`` likewise); every
    other name unchanged."""
    parts = name.split(".")
    if _is_fused_expert(parts):
        return tuple(".".join([*parts[:-1], "0", p]) for p in _FUSED_EXPERT_PROJECTIONS[parts[-1]])
    if "experts" not in parts[:-1]:
        return (name,)
    at = parts.index("experts")
    if not parts[at + 1].isdigit() or at + 2 >= len(parts):
        return (name,)
    return (".".join([*parts[: at + 1], "0", *parts[at + 2 :]]),)


def ct_expert_name(name: str) -> str:
    """The first of `ct_expert_names`: the one name a module is looked up by."""
    return ct_expert_names(name)[0]


@lru_cache(maxsize=1 << 18)
def vllm_view(module: str, method: str = methods.MODELOPT) -> tuple[str, str]:
    """``(shard, layer)``: the names vLLM matches a checkpoint module under, for ``method``.

    ``layer`` is the vLLM layer prefix (fused leaf, or ``...experts`` for a routed expert);
    ``shard`` is the unfused name vLLM compares *exact* patterns with. A VLM-prefixed
    drafter module is seen as ``mtp.<rest>`` (the MTP classes are built with prefix mtp).
    compressed-tensors sees a per-expert module ``...experts.N.proj`` as
    ``...experts.0.proj``: the name its MoE method looks the whole layer up by.
    """
    base = drafter_alias(module) or module
    parts = base.split(".")
    if "experts" in parts[:-1]:
        at = parts.index("experts")
        per_expert = parts[at + 1].isdigit() and at + 2 < len(parts)
        if method == methods.COMPRESSED_TENSORS and (per_expert or _is_fused_expert(parts)):
            name = ct_expert_name(base)
            return name, name
        layer = ".".join(parts[: at + 1])
        return layer, layer
    fused = FUSED_INTO.get(parts[-1])
    if fused is None:
        return base, base
    return base, ".".join([*parts[:-1], fused])


def _expert_rule_applies(shard: str, layer: str) -> bool:
    return shard == layer and "experts" in layer  # not a fused shard, "experts" in the name


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _expand_pattern(pattern: str) -> tuple[str, ...]:
    """vLLM's ``apply_vllm_mapper``: ``x*`` -> ``x`` and ``x.*`` (not for ``x.*``)."""
    if len(pattern) >= 2 and pattern[-1] == "*" and pattern[-2] != ".":
        return (pattern[:-1], pattern[:-1] + ".*")
    return (pattern,)


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
        if "" in node:  # a word ends here: the rest is not needed for a substring hit
            return ""
        branches = [re.escape(ch) + emit(child) for ch, child in node.items()]
        return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"

    return emit(trie)


@dataclass(frozen=True)
class _Rule:
    """The compiled forms of one pattern, or of all patterns of one declaration."""

    exact: frozenset[str]  # equal to the shard or the layer name
    experts: tuple[str, ...]  # vLLM's "experts" layer rule: layer name inside one of these
    substring: re.Pattern[str] | None  # ModelOpt: searched in the layer name
    substring_spans_lines: bool  # a literal holds a newline (joined-text search unsafe)
    regexes: tuple[re.Pattern[str], ...]  # re.match-ed on the layer (and shards, see below)
    regex_on_shards: bool  # compressed-tensors re-matches each fused shard too
    method: str  # whose view of a module's names the rule is matched against (`vllm_view`)


def _compile(patterns: list[str], method: str, source: str, *, merge_globs: bool) -> _Rule:
    exact: set[str] = set()
    experts: list[str] = []
    literals: set[str] = set()
    regexes: list[re.Pattern[str]] = []
    for pattern in patterns:
        forms: tuple[str, ...] = (pattern,)
        if method == methods.MODELOPT:
            forms = _expand_pattern(pattern)
            literals.update(forms)  # exact match on the layer is implied by substring
            regexes += [re.compile(translate(f)) for f in forms if _is_glob(f)]
        elif method == methods.COMPRESSED_TENSORS and pattern.startswith("re:"):
            try:
                regexes.append(re.compile(pattern[3:]))
            except re.error as exc:
                raise QuantConfigError(
                    f"{source} ignore entry {pattern!r} is not a valid regex ({exc})."
                ) from exc
        if not (pattern.startswith("re:") and method != methods.MODELOPT):
            exact.update(forms)
        # vLLM's exact stage (``is_layer_skipped``) treats a layer whose name contains
        # "experts" specially: it is skipped when it is a substring of any pattern that
        # contains "experts", so one per-expert entry excludes the whole routed-experts
        # layer. compressed-tensors uses its own matcher without this rule.
        if method != methods.COMPRESSED_TENSORS:
            experts += [f for f in forms if "experts" in f]
    if merge_globs and method == methods.MODELOPT and len(regexes) > 1:
        # fnmatch.translate output is self-contained ((?s:...)\Z), safe to alternate; user
        # "re:" regexes are not merged (their groups and flags could interact).
        regexes = [re.compile("|".join(f"(?:{rx.pattern})" for rx in regexes))]
    ordered = sorted(literals, key=len)
    return _Rule(
        exact=frozenset(exact),
        experts=tuple(experts),
        substring=re.compile(_trie_regex(ordered)) if ordered else None,
        substring_spans_lines=any("\n" in lit for lit in ordered),
        regexes=tuple(regexes),
        regex_on_shards=method != methods.MODELOPT,
        method=method,
    )


class _Names(Protocol):
    """The names of one module, or of many: what `_rule_hits` asks of them."""

    def any_exact(self, forms: frozenset[str]) -> bool: ...
    def any_expert_layer_in(self, forms: tuple[str, ...]) -> bool: ...
    def any_layer_contains(self, rule: _Rule) -> bool: ...
    def any_match(self, rule: _Rule) -> bool: ...


def _rule_hits(rule: _Rule, names: _Names) -> bool:
    """vLLM's exclusion rule: exact (layer or shard), the experts rule, substring, regex."""
    return (
        names.any_exact(rule.exact)
        or (bool(rule.experts) and names.any_expert_layer_in(rule.experts))
        or (rule.substring is not None and names.any_layer_contains(rule))
        or (bool(rule.regexes) and names.any_match(rule))
    )


class _OneModule:
    __slots__ = ("shard", "layer")

    def __init__(self, module: str, method: str, view: tuple[str, str] | None = None) -> None:
        self.shard, self.layer = view or vllm_view(module, method)

    def any_exact(self, forms: frozenset[str]) -> bool:
        return self.shard in forms or self.layer in forms

    def any_expert_layer_in(self, forms: tuple[str, ...]) -> bool:
        return _expert_rule_applies(self.shard, self.layer) and any(self.layer in f for f in forms)

    def any_layer_contains(self, rule: _Rule) -> bool:
        return rule.substring is not None and rule.substring.search(self.layer) is not None

    def any_match(self, rule: _Rule) -> bool:
        names = (
            (self.layer, self.shard) if rule.regex_on_shards and self.shard != self.layer else (self.layer,)
        )
        return any(rx.match(n) for rx in rule.regexes for n in names)


class ModuleSet:
    """Many modules, indexed so that "does this pattern match any of them" stays linear for
    ~100k modules (the audit's unused patterns, the rewrite's forbidden modules); one index
    per method, since methods see a module under different names (`vllm_view`)."""

    def __init__(self, modules: Iterable[str]) -> None:
        self._modules = list(dict.fromkeys(modules))
        self._indexes: dict[str, _ModuleIndex] = {}

    def index(self, method: str) -> _ModuleIndex:
        """The modules as ``method`` sees them (built once per method)."""
        if method not in self._indexes:
            self._indexes[method] = _ModuleIndex(self._modules, method)
        return self._indexes[method]


class _ModuleIndex:
    """The names of many modules under one method's view."""

    def __init__(self, modules: Iterable[str], method: str) -> None:
        views = {vllm_view(m, method) for m in modules}
        self._layers = sorted({layer for _, layer in views})
        self._names = sorted({n for view in views for n in view})
        self._name_set = frozenset(self._names)
        self._expert_layers = sorted({lay for shard, lay in views if _expert_rule_applies(shard, lay)})
        # Module names hold no newline, so a substring hit in the joined text is a hit in
        # one name (unless the literal itself spans lines: then name by name).
        self._text = "\n".join(self._layers)

    def any_exact(self, forms: frozenset[str]) -> bool:
        return not self._name_set.isdisjoint(forms)

    def any_expert_layer_in(self, forms: tuple[str, ...]) -> bool:
        return any(layer in f for f in forms for layer in self._expert_layers)

    def any_layer_contains(self, rule: _Rule) -> bool:
        rx = rule.substring
        if rx is None or not self._layers:  # "" would match the empty joined text
            return False
        if rule.substring_spans_lines:
            return any(rx.search(layer) for layer in self._layers)
        return rx.search(self._text) is not None

    def any_match(self, rule: _Rule) -> bool:
        names = self._names if rule.regex_on_shards else self._layers
        return any(rx.match(n) for rx in rule.regexes for n in names)


class ExclusionPattern:
    """One exclusion pattern compiled for the method's matching rule."""

    __slots__ = ("pattern", "_rule")

    def __init__(self, pattern: str, method: str, source: str = "pattern") -> None:
        self.pattern = pattern
        self._rule = _compile([pattern], method, source, merge_globs=False)

    def matches(self, module: str) -> bool:
        """Whether this pattern excludes ``module`` in vLLM."""
        return _rule_hits(self._rule, _OneModule(module, self._rule.method))

    def matches_any(self, modules: ModuleSet) -> bool:
        """Whether this pattern excludes at least one module of ``modules``."""
        return _rule_hits(self._rule, modules.index(self._rule.method))


class ExclusionMatcher:
    """All exclusion patterns of one declaration; `excludes` is one or two C-level regex
    calls per name, so auditing ~100k modules against ~200 patterns stays fast."""

    def __init__(self, method: str, patterns: Iterable[str], source: str) -> None:
        names = list(patterns)
        self.patterns = [ExclusionPattern(p, method, source) for p in names]
        self._rule = _compile(names, method, source, merge_globs=True)
        # by vLLM's view of a module: the 512 experts of one layer share one answer
        self._by_view: dict[tuple[str, str], bool] = {}

    def excludes(self, module: str) -> bool:
        """Whether any pattern excludes ``module``."""
        view = vllm_view(module, self._rule.method)
        hit = self._by_view.get(view)
        if hit is None:
            hit = self._by_view[view] = _rule_hits(self._rule, _OneModule(module, self._rule.method, view))
        return hit

    def matching(self, module: str) -> list[str]:
        """The patterns that exclude ``module``, in file order."""
        return [p.pattern for p in self.patterns if p.matches(module)]

    def unused(self, modules: ModuleSet) -> list[str]:
        """The patterns that exclude no module of ``modules``, in file order."""
        return [p.pattern for p in self.patterns if not p.matches_any(modules)]


def pattern_matches(pattern: str, module: str, *, method: str = methods.MODELOPT) -> bool:
    """Whether one exclusion pattern excludes ``module`` under vLLM's rule for ``method``."""
    return ExclusionPattern(pattern, method).matches(module)
