"""One row of ``mtpconv eval``, in its own process: ``python -m mtpconv.evaluation.worker JOB OUT``.

Reads the :class:`~mtpconv.evaluation.rows.RowJob` in ``JOB`` (JSON), builds vLLM's
``LLM`` with the user's engine arguments (vLLM's defaults otherwise: torch.compile and
CUDA graphs on a GPU), generates greedily once to warm up, then for each batch size
sends the prompts (cycled to at least :data:`MIN_GROUPS` full groups) in groups of that size
and records the token ids, vLLM's
spec-decode counters over exactly those requests, and the decode time (engine
timestamps of each request's first and last token). Writes everything to ``OUT``
(JSON) and exits; the parent compares rows.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from mtpconv.draft_vocab.prompts import Prompt, PromptKind
from mtpconv.evaluation.rows import RowJob

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
}
WARMUP_TOKENS = 8
# Each batch size sends at least this many full groups, so a large batch is timed over more than
# one short generate call.
MIN_GROUPS = 4


def _counters(llm: Any) -> dict[str, int]:
    metrics = llm.get_metrics()
    return {
        key: int(sum(getattr(m, "value", 0) for m in metrics if m.name == name))
        for key, name in COUNTERS.items()
    }


def _prompts(job: RowJob) -> list[Prompt]:
    return [
        Prompt(PromptKind.TEXT, p["prompt"], i)
        if "prompt" in p
        else Prompt(PromptKind.CHAT, p["messages"], i)
        for i, p in enumerate(job.prompts, start=1)
    ]


def _decode_seconds(outputs: list[Any]) -> float | None:
    """From the engine's timestamps: the first request's first token to the last one's last."""
    stats = [getattr(o, "metrics", None) for o in outputs]
    firsts = [getattr(s, "first_token_ts", 0.0) for s in stats]
    lasts = [getattr(s, "last_token_ts", 0.0) for s in stats]
    if not all(firsts) or not all(lasts):
        return None
    return max(lasts) - min(firsts)


def device_name() -> str:
    """The GPU the row runs on, or ``cpu``."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def engine_arguments(job: RowJob) -> dict[str, Any]:
    """vLLM ``LLM`` keyword arguments of ``job``'s row: its model, MTP with ``k`` drafts where
    the row speculates, the user's engine arguments."""
    args: dict[str, Any] = dict(model=job.model, seed=job.seed, disable_log_stats=False)
    if job.row.speculative:
        args["speculative_config"] = {"method": "mtp", "num_speculative_tokens": job.num_speculative_tokens}
    args.update(job.engine_args)
    return args


def model_runner(llm: Any) -> str:
    """``v1`` or ``v2``: the model runner vLLM chose."""
    return "v2" if getattr(llm.llm_engine.vllm_config, "use_v2_model_runner", False) else "v1"


def run_job(job: RowJob) -> dict[str, Any]:
    import vllm
    from vllm import LLM, SamplingParams

    from mtpconv.draft_vocab.generate import engine_prompts
    from mtpconv.evaluation.probe import describe_drafter

    started = time.perf_counter()
    llm = LLM(**engine_arguments(job))
    load_seconds = time.perf_counter() - started
    prompts = engine_prompts(llm, _prompts(job))
    greedy = SamplingParams(temperature=0.0, max_tokens=job.max_tokens, ignore_eos=True)
    llm.generate(
        prompts[: max(job.batches)],
        SamplingParams(temperature=0.0, max_tokens=WARMUP_TOKENS, ignore_eos=True),
        use_tqdm=False,
    )
    batches = []
    for batch in job.batches:
        n = max(len(prompts), batch * MIN_GROUPS)
        n += -n % batch
        requests = [prompts[i % len(prompts)] for i in range(n)]
        before = _counters(llm)
        outputs: list[list[int]] = []
        decode = 0.0
        exact = True
        wall_start = time.perf_counter()
        for lo in range(0, n, batch):
            group = llm.generate(requests[lo : lo + batch], greedy, use_tqdm=False)
            outputs += [list(o.outputs[0].token_ids) for o in group]
            seconds = _decode_seconds(group)
            exact = exact and seconds is not None
            decode += seconds or 0.0
        wall = time.perf_counter() - wall_start
        after = _counters(llm)
        batches.append(
            {
                "batch": batch,
                "outputs": outputs,
                "requests": n,
                "generated": sum(len(o) for o in outputs),
                "decode_seconds": decode if exact else None,
                "wall_seconds": wall,
                **{key: after[key] - before[key] for key in COUNTERS},
            }
        )
    config = llm.llm_engine.vllm_config
    drafter = describe_drafter_safely(llm, describe_drafter) if job.row.speculative else None
    return {
        "row": job.row.value,
        "model": job.model,
        "vllm_version": vllm.__version__,
        "device": device_name(),
        "model_runner": model_runner(llm),
        "enforce_eager": bool(config.model_config.enforce_eager),
        "load_seconds": load_seconds,
        "batches": batches,
        "drafter": drafter,
    }


def describe_drafter_safely(llm: Any, probe: Any) -> dict[str, Any]:
    """The probe's result from the first worker; an ``error`` entry where vLLM cannot run it."""
    try:
        return dict(llm.collective_rpc(probe)[0])
    except Exception as exc:  # the report says so; the row's figures still stand
        return {"class": None, "modules": {}, "error": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str]) -> int:
    job_path, out_path = Path(argv[0]), Path(argv[1])
    job = RowJob.from_json(json.loads(job_path.read_text(encoding="utf-8")))
    result = run_job(job)
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    tmp.replace(out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
