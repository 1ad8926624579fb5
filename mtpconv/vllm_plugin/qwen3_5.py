"""Qwen3.5 dense and MoE drafters (``Qwen3_5MTP``, ``Qwen3_5MoeMTP``)."""

from __future__ import annotations

from vllm.model_executor.models.qwen3_5_mtp import Qwen3_5MoeMTP, Qwen3_5MTP

from mtpconv.vllm_plugin.drafter import MtpconvDrafterMixin, StageLocalForward


class MtpconvQwen3_5MTP(StageLocalForward, MtpconvDrafterMixin, Qwen3_5MTP):  # type: ignore[misc]
    """vLLM's ``Qwen3_5MTP`` serving ``-mtpfp8`` variants."""


class MtpconvQwen3_5MoeMTP(StageLocalForward, MtpconvDrafterMixin, Qwen3_5MoeMTP):  # type: ignore[misc]
    """vLLM's ``Qwen3_5MoeMTP`` serving ``-mtpfp8`` variants."""
