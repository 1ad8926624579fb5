"""quantconfig.match: vLLM's exclusion rule, per pattern and per method."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpconv.errors import QuantConfigError
from mtpconv.quantconfig.match import (
    ExclusionMatcher,
    ExclusionPattern,
    ModuleSet,
    pattern_matches,
    vllm_view,
)
from tests.quantconfig.samples import (
    VLM,
)

# -------------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("pattern", "module", "expected"),
    [
        # x* means x and x.*  (and, through substring, anything containing x)
        ("mtp.layers.0*", "mtp.layers.0.self_attn.q_proj", True),
        ("mtp.layers.0*", "mtp.layers.0", True),
        ("mtp.layers.0*", "mtp.fc", False),
        ("mtp.layers.1*", "mtp.layers.10.mlp.gate", True),  # substring, as vLLM
        ("mtp.*", "mtp.fc", True),  # ends in ".*": not split, plain fnmatch
        ("mtp.*", "mtp", False),
        # substring
        ("self_attn", f"{VLM}layers.3.self_attn.o_proj", True),
        ("lm_head", "lm_head", True),
        ("lm_head", "mtp.draft_lm_head", True),  # the trap
        ("mtp.fc", "mtp.fc_hidden", True),  # substring again
        # fnmatch
        (f"{VLM}layers.*.mlp.gate", f"{VLM}layers.17.mlp.gate", True),
        (f"{VLM}layers.*.mlp.gate", f"{VLM}layers.17.mlp.gate_proj", False),
        ("*.mlp.gate", f"{VLM}layers.0.mlp.gate", True),
        ("model.visual*", "model.visual.blocks.0.attn.qkv", True),
        ("layers.?.mlp.gate", "layers.3.mlp.gate", True),
        # a VLM-prefixed drafter is matched as vLLM's drafter names it: mtp.<rest>
        ("mtp.*", f"{VLM}mtp.fc", True),
        ("mtp.fc", f"{VLM}mtp.fc", True),
        (f"{VLM}layers.*", f"{VLM}mtp.layers.0.self_attn.q_proj", False),
        (f"{VLM}mtp.fc", f"{VLM}mtp.fc", False),  # vLLM maps the pattern, not the drafter
        # fused layers: globs see qkv_proj, exact patterns see the shard
        ("*.q_proj", f"{VLM}layers.3.self_attn.q_proj", False),
        (f"{VLM}layers.3.self_attn.q_proj", f"{VLM}layers.3.self_attn.q_proj", True),
        (f"{VLM}layers.3.self_attn.q_proj*", f"{VLM}layers.3.self_attn.q_proj", True),
        ("*.qkv_proj", f"{VLM}layers.3.self_attn.k_proj", True),
        ("in_proj_ba", f"{VLM}layers.0.linear_attn.in_proj_a", True),
        # routed experts are one vLLM layer
        # (vLLM's exact stage: an "experts" layer is skipped when its name is a substring
        # of any pattern containing "experts": one per-expert entry excludes all experts)
        ("mtp.layers.0.mlp.experts.0.up_proj", "mtp.layers.0.mlp.experts.1.up_proj", True),
        ("*.experts.0.up_proj", "mtp.layers.0.mlp.experts.1.up_proj", False),
        ("mtp.layers.0.mlp.experts", "mtp.layers.0.mlp.experts.0.up_proj", True),
        ("*.experts", "mtp.layers.0.mlp.experts.gate_up_proj", True),
    ],
)
def test_modelopt_matching(pattern: str, module: str, expected: bool) -> None:
    assert pattern_matches(pattern, module) is expected


@pytest.mark.parametrize(
    ("pattern", "module", "method", "expected"),
    [
        ("re:.*mlp.gate$", "model.layers.0.mlp.gate", "compressed-tensors", True),
        ("re:.*mlp.gate$", "model.layers.0.mlp.gate_proj", "compressed-tensors", False),
        ("lm_head", "mtp.draft_lm_head", "compressed-tensors", False),  # exact only
        ("lm_head", "lm_head", "compressed-tensors", True),
        ("mtp*", "mtp.fc", "compressed-tensors", False),  # no globbing
        ("lm_head", "mtp.draft_lm_head", "fp8", False),
    ],
)
def test_other_methods_matching(pattern: str, module: str, method: str, expected: bool) -> None:
    assert pattern_matches(pattern, module, method=method) is expected


# ------------------------------------------------- one rule, three questions agree

_PATTERNS = st.sampled_from(
    [
        "mtp*",
        "mtp.*",
        "mtp.fc",
        "lm_head",
        "mtp.layers.0*",
        "*.mlp.gate",
        "*.q_proj",
        "*.qkv_proj",
        "self_attn",
        "mtp.layers.0.mlp.experts.1.up_proj",
        "*.experts.0.up_proj",
        "*experts*",
        f"{VLM}layers.0.self_attn.q_proj",
        f"{VLM}mtp.fc",
        "re:.*mlp.gate$",
        "re:^mtp.*",
        "",
        "layers.?.mlp.gate",
        f"{VLM}layers.*.mlp.gate",
        "model.visual*",
        "in_proj_ba",
    ]
)
_MODULES = st.sampled_from(
    [
        "mtp.fc",
        "mtp.draft_lm_head",
        "lm_head",
        "mtp.layers.0.self_attn.q_proj",
        "mtp.layers.0.mlp.experts.1.up_proj",
        "mtp.layers.0.mlp.experts.0.down_proj",
        "mtp.layers.10.mlp.gate",
        f"{VLM}mtp.fc",
        f"{VLM}layers.0.self_attn.q_proj",
        f"{VLM}layers.0.self_attn.o_proj",
        f"{VLM}layers.0.mlp.gate",
        f"{VLM}layers.0.linear_attn.in_proj_a",
        "model.visual.blocks.0.attn.qkv",
        "layers.3.mlp.gate",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    patterns=st.lists(_PATTERNS, max_size=5),
    modules=st.lists(_MODULES, max_size=6),
    method=st.sampled_from(["modelopt", "compressed-tensors", "fp8"]),
)
def test_matcher_questions_agree(patterns: list[str], modules: list[str], method: str) -> None:
    """excludes / matching / unused / matches_any are the same rule as matches."""
    matcher = ExclusionMatcher(method, patterns, "test")
    module_set = ModuleSet(modules)
    for module in modules:
        hits = [p for p in patterns if ExclusionPattern(p, method).matches(module)]
        assert matcher.excludes(module) is bool(hits)
        assert matcher.matching(module) == hits
    for p in patterns:
        pattern = ExclusionPattern(p, method)
        assert pattern.matches_any(module_set) is any(pattern.matches(m) for m in modules)
    assert matcher.unused(module_set) == [
        p for p in patterns if not any(ExclusionPattern(p, method).matches(m) for m in modules)
    ]


def test_module_set_substring_does_not_span_two_names() -> None:
    """Names are searched joined by newlines; a literal that spans lines is searched per name."""
    modules = ModuleSet(["a.b", "c.d"])
    assert not ExclusionPattern("b\nc", "modelopt").matches_any(modules)
    assert ExclusionPattern("b", "modelopt").matches_any(modules)


def test_unused_patterns_in_file_order() -> None:
    matcher = ExclusionMatcher("modelopt", ["mtp.layers.9*", "lm_head", "model.visual*"], "config.json")
    assert matcher.unused(ModuleSet(["lm_head", "mtp.fc"])) == ["mtp.layers.9*", "model.visual*"]


def test_bad_regex_names_the_source() -> None:
    with pytest.raises(QuantConfigError, match=r"config.json ignore entry 're:\('"):
        ExclusionMatcher("compressed-tensors", ["re:("], "config.json")


def test_vllm_view_fuses_and_aliases() -> None:
    assert vllm_view(f"{VLM}layers.0.self_attn.k_proj") == (
        f"{VLM}layers.0.self_attn.k_proj",
        f"{VLM}layers.0.self_attn.qkv_proj",
    )
    assert vllm_view("mtp.layers.0.mlp.experts.3.up_proj") == ("mtp.layers.0.mlp.experts",) * 2
    assert vllm_view(f"{VLM}mtp.fc") == ("mtp.fc", "mtp.fc")
