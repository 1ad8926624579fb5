"""Runs on vLLM's worker: our drafter's forward under a faked pipeline position.

vLLM builds the drafter only on the last PP stage, with every weight there. The
probe takes the drafter vLLM loaded (real vLLM modules: embedding, norms, FP8
``fc``), makes ``get_pp_group()`` report a non-first rank (a middle one, then
the last one) and calls the forward. The decoder layer's attention needs
vLLM's per-step attention metadata, so that one layer is stood in by a
pass-through. For contrast it runs vLLM's own predictor forwards on the same
modules: ``Qwen3NextMultiTokenPredictor`` (branches on ``is_first_rank``) and
``Qwen3_5MultiTokenPredictor`` (returns IntermediateTensors off the last rank).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch


def _describe(out: Any, calls: list[int], ref: torch.Tensor) -> dict[str, Any]:
    is_tensor = isinstance(out, torch.Tensor)
    return {
        "type": "Tensor" if is_tensor else type(out).__name__,
        "shape": list(out.shape) if is_tensor else None,
        "embedded": len(calls),
        "equal_single_rank": bool(is_tensor and torch.equal(out, ref)),
    }


def stage_local_probe(worker: Any) -> dict[str, Any]:
    import vllm.distributed as distributed
    from vllm.distributed import parallel_state
    from vllm.model_executor.models import qwen3_5_mtp, qwen3_next_mtp

    drafter = worker.model_runner.drafter.model
    predictor = drafter.model
    layer = predictor.layers[0]
    device = next(drafter.parameters()).device
    ids = torch.tensor([10, 11, 12], device=device)
    positions = torch.arange(3, device=device)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, int(drafter.config.hidden_size), generator=g).to(torch.bfloat16).to(device)

    calls: list[int] = []
    embed = predictor.embed_input_ids

    def counting_embed(input_ids: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        out: torch.Tensor = embed(input_ids)
        return out

    def passthrough(
        positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return hidden_states, torch.zeros_like(hidden_states)

    targets = [parallel_state, distributed, qwen3_5_mtp, qwen3_next_mtp]
    originals = [getattr(m, "get_pp_group") for m in targets]  # noqa: B009
    layer.forward = passthrough
    predictor.embed_input_ids = counting_embed
    results: dict[str, Any] = {}
    try:
        with torch.inference_mode():
            ref = drafter(ids, positions, hidden)
            for rank, last in (("middle", False), ("last", True)):
                group = SimpleNamespace(
                    is_first_rank=False, is_last_rank=last, world_size=3, rank_in_group=1 if not last else 2
                )
                for m in targets:
                    m.get_pp_group = lambda group=group: group
                try:
                    calls.clear()
                    results[f"ours_{rank}"] = _describe(drafter(ids, positions, hidden), calls, ref)
                    if last:
                        try:
                            out = qwen3_next_mtp.Qwen3NextMultiTokenPredictor.forward(
                                predictor, ids, positions, hidden
                            )
                            results["stock_qwen3_next_last"] = type(out).__name__
                        except AssertionError:
                            results["stock_qwen3_next_last"] = "AssertionError"
                    else:
                        out = qwen3_5_mtp.Qwen3_5MultiTokenPredictor.forward(
                            predictor, ids, positions, hidden
                        )
                        results["stock_qwen3_5_middle"] = type(out).__name__
                finally:
                    for m, original in zip(targets, originals, strict=True):
                        m.get_pp_group = original
    finally:
        del layer.forward
        del predictor.embed_input_ids
    return results
