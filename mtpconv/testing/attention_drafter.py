"""A planted model whose drafter's attention matters: for draft-window measurements.

The planted drafter (mtpconv.testing.planted) barely uses its attention: its
``o_proj`` adds a small perturbation to the embedding it passes through, so a
sliding window on it changes nothing measurable. :func:`amplify_drafter_attention`
scales that ``o_proj`` by ``gain``, so the drafter's proposal depends on the
tokens its attention reads and bounding that attention can cost acceptance.
The target's tensors are untouched, so its greedy output is the planted ``t + 1``
chain as before.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

O_PROJ = "mtp.layers.0.self_attn.o_proj.weight"


def amplify_drafter_attention(model_dir: str | Path, gain: float) -> Path:
    """Multiply the drafter's attention output projection of a planted model by ``gain`` (in place)."""
    path = Path(model_dir) / "model.safetensors"
    tensors = load_file(str(path))
    if O_PROJ not in tensors:
        raise KeyError(f"{path} has no {O_PROJ}; build it with mtpconv.testing.planted (dense)")
    tensors[O_PROJ] = (tensors[O_PROJ].float() * gain).to(torch.bfloat16).contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})
    return Path(model_dir)
