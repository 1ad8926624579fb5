"""Qwen3-Next drafter (``Qwen3NextMTP``).

vLLM 0.32's ``Qwen3NextMTP`` branches on the target's first-rank flag and
asserts on the last rank under pipeline parallelism; the mixin's stage-local
forward replaces that.
"""

from __future__ import annotations

from vllm.model_executor.models.qwen3_next_mtp import Qwen3NextMTP

from mtpconv.vllm_plugin.drafter import MtpconvDrafterMixin, StageLocalForward


class MtpconvQwen3NextMTP(StageLocalForward, MtpconvDrafterMixin, Qwen3NextMTP):
    """vLLM's ``Qwen3NextMTP`` serving ``-mtpfp8`` variants, stage-local under PP."""
