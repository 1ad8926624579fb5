"""quantconfig.match: vLLM's exclusion rule, per pattern and per method."""

from __future__ import annotations

import pytest

from mtpconv.quantconfig.match import pattern_matches
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
