"""The MTP drafter architectures of a vLLM registry, read from ``registry.py``'s source.

Shared by the registry-walk test (the installed vLLM, and pinned data for other versions) and
``scripts/pin_vllm_registry.py`` (which writes that pinned data from a downloaded wheel).
Read from the source, not imported: importing vLLM drags in torchvision's ops, which this
environment's build lacks, and a downloaded wheel is never installed.
"""

from __future__ import annotations

import ast

REGISTRY_FILE = "vllm/model_executor/models/registry.py"
# The registry dicts that hold MTP drafters: vLLM's own classes, and (0.33+) the Transformers
# backend's, which serves the MTP layers of a model through its transformers code.
MTP_DICTS = ("_SPECULATIVE_DECODING_MODELS", "_TRANSFORMERS_BACKEND_MODELS")


def mtp_architectures(source: str) -> dict[str, tuple[str, str]]:
    """Every MTP drafter architecture of a ``registry.py`` source -> (module, class).

    EAGLE, Medusa, DFlash and DSpark drafters are other speculative methods: an architecture
    counts when its name says ``MTP`` and it is not an ``Eagle*`` one.
    """
    out: dict[str, tuple[str, str]] = {}
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Dict):
            continue
        names = {t.id for t in node.targets if isinstance(t, ast.Name)}
        if not names & set(MTP_DICTS):
            continue
        found |= names & set(MTP_DICTS)
        for key, value in zip(node.value.keys, node.value.values, strict=True):
            if not isinstance(key, ast.Constant) or not isinstance(key.value, str):
                continue
            arch = key.value
            if "MTP" not in arch or arch.startswith("Eagle"):
                continue
            assert isinstance(value, ast.Tuple), arch
            module, cls = (e.value for e in value.elts if isinstance(e, ast.Constant))
            out[arch] = (str(module), str(cls))
    if "_SPECULATIVE_DECODING_MODELS" not in found:
        raise ValueError("registry.py source has no _SPECULATIVE_DECODING_MODELS")
    return out
