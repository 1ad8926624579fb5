"""What our drafter classes add to vLLM's: FP8 linears, the truncated draft head,
and (Qwen) a stage-local forward.

:class:`MtpconvDrafterMixin` goes first in the bases of a subclass of one of
vLLM's MTP classes (``Qwen3_5MTP``, ``Qwen3_5MoeMTP``, ``Qwen3NextMTP``, ``MiMoMTP``).
Those all keep the drafter stack in ``self.model`` and their config in ``self.config``.
The Qwen classes load checkpoint names ``mtp.X`` as ``model.X`` and put
:class:`StageLocalForward` before it; a class whose vLLM module names differ from the
checkpoint's (MiMo) says how through :meth:`MtpconvDrafterMixin.vllm_module_names`.

Without ``mtpconv.json`` nothing is swapped or added: the class builds and loads
exactly as vLLM's. The stage-local forward is used in both cases; on one pipeline
rank it computes what vLLM's does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
from vllm.config import VllmConfig
from vllm.distributed import tensor_model_parallel_all_gather
from vllm.logger import init_logger
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.utils import maybe_prefix, sequence_parallel_chunk

from mtpconv.conversion_options import HeadDtype
from mtpconv.errors import ManifestError
from mtpconv.vllm_plugin import shared_expert
from mtpconv.vllm_plugin.quant import DrafterQuantConfig, DraftHeadQuantConfig
from mtpconv.vllm_plugin.settings import DRAFT_VOCAB_ENV, DrafterSettings, drafter_settings

logger = init_logger("vllm.plugins.mtpconv")

DRAFT_HEAD_ATTR = "draft_lm_head"  # under self.model: checkpoint name mtp.draft_lm_head.*


@contextmanager
def _drafter_quant_config(vllm_config: VllmConfig, cfg: DrafterQuantConfig) -> Iterator[None]:
    """Build the drafter's layers with ``cfg`` instead of the target's quant config."""
    original = vllm_config.quant_config
    vllm_config.quant_config = cfg
    try:
        yield
    finally:
        vllm_config.quant_config = original


@contextmanager
def _drafter_attention_window(vllm_config: VllmConfig, window: int | None) -> Iterator[None]:
    """Build the drafter's ``Attention`` layers with a sliding window of ``window`` tokens.

    vLLM's MTP classes build their decoder layer, hence ``Attention``, without a
    ``per_layer_sliding_window``; ``Attention`` then takes the model-level window from
    the ``cache_config`` it is given (vllm/model_executor/layers/attention/attention.py),
    and that one object is all the drafter's constructor shares with nothing else while
    it runs. Setting it for the construction only and restoring it gives exactly the
    layer ``per_layer_sliding_window=window`` would (its ``sliding_window``, its
    backend impl, a ``SlidingWindowSpec`` KV cache), with no vLLM class patched;
    the target was built before and is untouched. ``None``: nothing changes.
    """
    if window is None:
        yield
        return
    cache_config = vllm_config.cache_config
    original = cache_config.sliding_window
    cache_config.sliding_window = window
    try:
        yield
    finally:
        cache_config.sliding_window = original


def stage_local_forward(
    model: Any,
    input_ids: torch.Tensor | None,
    positions: torch.Tensor,
    hidden_states: torch.Tensor,
    inputs_embeds: torch.Tensor | None = None,
    spec_step_idx: int = 0,
) -> torch.Tensor:
    """One MTP step over vLLM's predictor modules, independent of the PP rank.

    vLLM runs the drafter only on the last pipeline stage, with weights built
    there in full: so it always embeds here and always returns hidden states,
    never IntermediateTensors for a next stage that does not exist for it.
    """
    if inputs_embeds is None:
        inputs_embeds = model.embed_input_ids(input_ids)
    inputs_embeds = model.pre_fc_norm_embedding(inputs_embeds)
    hidden_states = model.pre_fc_norm_hidden(hidden_states)
    hidden_states = model.fc(torch.cat([inputs_embeds, hidden_states], dim=-1))
    layer = model.layers[spec_step_idx % model.num_mtp_layers]
    scatter = bool(getattr(layer, "use_attn_reduce_scatter_for_moe", False))
    if scatter:
        hidden_states = sequence_parallel_chunk(hidden_states)
    hidden_states, residual = layer(positions=positions, hidden_states=hidden_states, residual=None)
    hidden_states, _ = model.norm(hidden_states, residual)
    if scatter:
        hidden_states = tensor_model_parallel_all_gather(hidden_states, 0)
        hidden_states = hidden_states[: positions.shape[-1]]
    return hidden_states


def head_quantization_not_applied(speculative_config: object, rows: int) -> str | None:
    """What to tell a user who set vLLM's ``draft_lm_head_quantization`` (0.33, Model Runner V2)
    for a variant with its own draft head: vLLM quantizes a copy of the target's head for the
    drafter, but this drafter drafts with ``draft_lm_head`` and never reads that copy."""
    asked = getattr(speculative_config, "draft_lm_head_quantization", None)
    if asked is None:
        return None
    return (
        f"mtpconv: draft_lm_head_quantization={asked} is not applied: this variant drafts with its own "
        f"{rows:,}-row draft head (vLLM's quantized copy of the target head is built but unused; "
        f"{DRAFT_VOCAB_ENV}=0 drafts with that copy instead)"
    )


class MtpconvDrafterMixin:
    """Mixed in before one of vLLM's MTP model classes."""

    model: Any
    config: Any
    packed_modules_mapping: dict[str, list[str]]
    mtpconv: DrafterSettings | None
    draft_logits_processor: LogitsProcessor | None

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        mc = vllm_config.model_config
        text = getattr(mc, "hf_text_config", None) or mc.hf_config
        settings = drafter_settings(mc.model, mc.revision, int(text.vocab_size))
        if settings is None:
            super().__init__(vllm_config=vllm_config, prefix=prefix)  # type: ignore[call-arg]
            self.mtpconv = None
            self.draft_logits_processor = None
            return
        base = vllm_config.quant_config
        cfg = DrafterQuantConfig(
            base,
            settings.fp8_modules,
            type(self).packed_modules_mapping,
            settings.scale_layouts,
            type(self).vllm_module_names(settings, vllm_config),
        )
        window = settings.attention_window
        with _drafter_quant_config(vllm_config, cfg), _drafter_attention_window(vllm_config, window):
            super().__init__(vllm_config=vllm_config, prefix=prefix)  # type: ignore[call-arg]
        self.quant_config = base
        self.mtpconv = settings
        self.draft_logits_processor = None
        head = settings.head
        if head is not None:
            k = int(head.ids.numel())
            draft_head = ParallelLMHead(
                k,
                int(self.config.hidden_size),
                quant_config=DraftHeadQuantConfig() if head.dtype is HeadDtype.FP8 else None,
                prefix=maybe_prefix(maybe_prefix(prefix, "mtp"), DRAFT_HEAD_ATTR),
            )
            self.model.add_module(DRAFT_HEAD_ATTR, draft_head)
            ids = head.ids.to(cast(torch.Tensor, draft_head.weight).device)
            self.model.register_buffer("draft_vocab_ids", ids, persistent=False)
            self.draft_logits_processor = LogitsProcessor(k)
            unused = head_quantization_not_applied(vllm_config.speculative_config, k)
            if unused is not None:
                logger.warning("%s", unused)
        logger.info(
            "mtpconv: drafter of %s with %d FP8 linears, draft head %s, attention window %s",
            settings.model_dir,
            len(settings.fp8_modules),
            "off" if head is None else f"{head.ids.numel()} rows {head.dtype}",
            "full" if window is None else f"{window} tokens",
        )

    @classmethod
    def vllm_module_names(cls, settings: DrafterSettings, vllm_config: VllmConfig) -> dict[str, str] | None:
        """vLLM module name -> checkpoint name of each FP8 drafter linear, where they differ;
        ``None``: vLLM's name is the checkpoint's ``mtp.…`` name (the Qwen classes)."""
        del settings, vllm_config
        return None

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor | None:
        """Full-vocabulary logits; ``-inf`` outside the draft ids when the head is truncated."""
        if self.draft_logits_processor is None:
            out = super().compute_logits(hidden_states, spec_step_idx)  # type: ignore[misc]
            return cast("torch.Tensor | None", out)
        sub: torch.Tensor | None = self.draft_logits_processor(
            getattr(self.model, DRAFT_HEAD_ATTR), hidden_states
        )
        if sub is None:
            return None
        full = sub.new_full((sub.shape[0], int(self.config.vocab_size)), float("-inf"))
        full.index_copy_(1, self.model.draft_vocab_ids, sub)
        return full

    def get_top_tokens(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        """Greedy draft token ids in the target vocabulary (vLLM's local-argmax path). V2's
        multi-module MTP speculator passes ``spec_step_idx``; the draft head serves every step."""
        if self.draft_logits_processor is None:
            parent = getattr(super(), "get_top_tokens", None)
            if parent is not None:
                # vLLM's single-module MTP classes take hidden_states alone.
                if spec_step_idx:
                    step_top: torch.Tensor = parent(hidden_states, spec_step_idx=spec_step_idx)
                    return step_top
                top: torch.Tensor = parent(hidden_states)
                return top
            logits = self.compute_logits(hidden_states, spec_step_idx)
            assert logits is not None
            return logits.argmax(dim=-1)
        local = self.draft_logits_processor.get_top_tokens(
            getattr(self.model, DRAFT_HEAD_ATTR), hidden_states
        )
        ids: torch.Tensor = self.model.draft_vocab_ids
        return ids[local]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """vLLM's loading; then the draft head from its own file (outside what vLLM loads).

        Draft-head tensors in the weight stream (variants from before the head had its
        own file) load with the rest, or are skipped when the head is switched off.
        """
        settings = self.mtpconv
        if settings is not None and (self.draft_logits_processor is None or settings.head is None):
            weights = ((n, w) for n, w in weights if f".{DRAFT_HEAD_ATTR}." not in f".{n}")
        loaded: set[str] = super().load_weights(weights)  # type: ignore[misc]
        if settings is not None and settings.head is not None and settings.head.file is not None:
            loaded |= self._load_draft_head(settings.head.file)
        return loaded

    def process_weights_after_loading(self) -> None:
        """vLLM's model-level hook, run after every layer's quant method has prepared its
        weights: switch the drafter's FP8 gated MLPs (the MoE shared expert) to one
        ``torch.ops.mtpconv.fp8_mlp`` call each (:mod:`mtpconv.vllm_plugin.shared_expert`)."""
        parent = getattr(super(), "process_weights_after_loading", None)
        if parent is not None:
            parent()
        if self.mtpconv is None:
            return
        switched, gated = shared_expert.fuse_gated_mlps(cast(torch.nn.Module, self.model))
        if gated:
            logger.info("mtpconv: %s", shared_expert.summary(switched, gated))

    def _load_draft_head(self, path: Path) -> set[str]:
        """Load ``mtp.draft_lm_head.*`` from the head's file into ``model.draft_lm_head``."""
        from safetensors import safe_open

        module = getattr(self.model, DRAFT_HEAD_ATTR)
        params = dict(module.named_parameters())
        loaded: set[str] = set()
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118  (safe_open is not a dict)
                attr = name.rsplit(f"{DRAFT_HEAD_ATTR}.", 1)[-1]
                param = params.get(attr)
                if param is None:
                    raise ManifestError(f"{path}: {name} is not a parameter of the draft head.")
                loader = getattr(param, "weight_loader", default_weight_loader)
                loader(param, f.get_tensor(name))
                loaded.add(f"model.{DRAFT_HEAD_ATTR}.{attr}")
        missing = set(params) - {n.rsplit(".", 1)[-1] for n in loaded}
        if missing:
            raise ManifestError(f"{path} lacks the draft head's {sorted(missing)}; re-run quantize-mtp.")
        return loaded


class StageLocalForward:
    """The Qwen drafters' forward, independent of the target's pipeline stage
    (:func:`stage_local_forward`); goes before :class:`MtpconvDrafterMixin`."""

    model: Any

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """Stage-local: ``intermediate_tensors`` never reach the drafter's math."""
        del intermediate_tensors, kwargs  # vLLM's classes ignore the step index too
        return stage_local_forward(self.model, input_ids, positions, hidden_states, inputs_embeds)
