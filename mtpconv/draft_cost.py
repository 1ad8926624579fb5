"""Bytes the drafter reads per draft step: now, after FP8, and with a K-row head.

A decode-time draft step is memory-bound, so bytes read is the cost model.
Per step the drafter reads every non-expert tensor of the drafter, the
routed experts a token selects (``experts_per_token / num_experts`` of them at
one token), one of the MTP layers (step ``i`` runs layer ``i mod n``), and the LM
head; an embedding lookup reads one row and is ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from mtpconv.checkpoint.safetensors_io import TensorInfo
from mtpconv.layouts import MtpLayout

_ROUTED_EXPERT = re.compile(r"\.experts\.(\d+\.|gate_up_proj$|down_proj$)")
_PER_LAYER = re.compile(r"(mtp\.layers\.|model\.layers\.|mtp_layers\.)\d+\.")
_FP8_SCALE_BYTES = 4


@dataclass(frozen=True)
class DraftCost:
    """Bytes per draft step (one token) of the drafter stack and its head."""

    stack_now: int
    stack_fp8: int
    head_rows: int
    head_now: int
    draft_vocab_size: int
    head_fp8_truncated: int

    @property
    def total_now(self) -> int:
        return self.stack_now + self.head_now

    @property
    def total_fp8(self) -> int:
        return self.stack_fp8 + self.head_now

    @property
    def total_fp8_truncated(self) -> int:
        return self.stack_fp8 + self.head_fp8_truncated

    def to_dict(self) -> dict[str, int]:
        doc = asdict(self)
        doc.update(
            total_now=self.total_now, total_fp8=self.total_fp8, total_fp8_truncated=self.total_fp8_truncated
        )
        return doc


def _expert_fraction(layout: MtpLayout) -> float:
    if not layout.num_experts or not layout.experts_per_token:
        return 1.0
    return min(1.0, layout.experts_per_token / layout.num_experts)


def draft_cost(layout: MtpLayout, tensors: Mapping[str, TensorInfo], draft_vocab_size: int) -> DraftCost:
    """Bytes one draft step reads, from headers only."""
    fraction = _expert_fraction(layout)
    layers = max(layout.found_layers, 1)
    linear_weights = {lin.weight: lin for lin in layout.linears}
    aux = {name for lin in layout.linears for name in lin.aux}
    stack_now = 0.0
    stack_fp8 = 0.0
    for name in layout.drafter_tensors:
        info = tensors[name]
        if name.endswith("embed_tokens.weight") or "shared_head.head" in name or "draft_lm_head" in name:
            continue  # a lookup reads one row; a drafter-own head is counted as the head
        share = fraction if _ROUTED_EXPERT.search(name) else 1.0
        if layers > 1 and _PER_LAYER.search(name):
            share /= layers  # each draft step runs one of the MTP layers
        stack_now += info.nbytes * share
        if name in linear_weights:
            stack_fp8 += (math.prod(linear_weights[name].shape) + _FP8_SCALE_BYTES) * share
        elif name not in aux:
            stack_fp8 += info.nbytes * share
    head_name = next(
        (n for n in layout.drafter_tensors if "shared_head.head" in n),
        layout.lm_head or (layout.embedding if layout.tie_word_embeddings else None),
    )
    head = tensors.get(head_name) if head_name else None
    rows = head.shape[0] if head is not None and head.shape else (layout.vocab_size or 0)
    hidden = layout.hidden_size or (head.shape[1] if head is not None and len(head.shape) > 1 else 0)
    head_now = head.nbytes if head is not None else rows * hidden * 2
    k = min(draft_vocab_size, rows) if rows else draft_vocab_size
    truncated = [n for n in layout.drafter_tensors if "draft_lm_head" in n]
    if truncated:  # a variant: its draft step already reads the truncated head
        head_now = sum(tensors[n].nbytes for n in truncated)
        k = next(tensors[n].shape[0] for n in truncated if n.endswith(".weight"))
    return DraftCost(
        stack_now=round(stack_now),
        stack_fp8=round(stack_fp8),
        head_rows=rows,
        head_now=head_now,
        draft_vocab_size=k,
        head_fp8_truncated=k * hidden + _FP8_SCALE_BYTES,
    )
