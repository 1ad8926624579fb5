"""vLLM end-to-end tests on CPU: environment, tiny checkpoints and their variants.

Everything runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the
``uni`` executor), one ``LLM`` at a time. The torchvision stub is applied here
and, through ``sitecustomize`` on ``PYTHONPATH``, in the processes vLLM spawns.
Skipped as a whole when vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

collect_ignore_glob: list[str] = []
if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # Before vLLM or huggingface_hub is imported: they read their environment once.
    from fixtures.vllm_stub import use_in_this_environment

    use_in_this_environment()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny source checkpoints and their ``-mtpfp8`` variants (real ``quantize-mtp``).

    ``planted*``: next token ``t + 1``; ``random*``: a fixed random permutation with
    a random drafter; ``moe*``: the planted model with a Qwen3.5-MoE layout.
    ``next*``: the same in the Qwen3-Next layout. ``*_fp8`` has FP8 drafter linears; ``*_fp8_vocab`` adds a 384-row FP8 draft head
    (ids 0..383), ``*_fp8_vocab_bf16`` the same head in BF16. ``mimo*``: the planted model
    in Xiaomi's MiMo layout (``MiMoMTP``; ``mimo_swapped``: ``input_proj`` halves exchanged;
    ``mimo_fp8_vocab``: FP8 drafter + the 384-row FP8 draft head).
    """
    from fixtures.planted import build_model as build
    from fixtures.planted_mimo import build_mimo_model
    from fixtures.vllm_run import quantize_mtp, write_ids

    root = tmp_path_factory.mktemp("vllm_models")
    ids = write_ids(root / "ids.pt", list(range(384)))
    out: dict[str, Path] = {}
    for name, kw in {
        "planted": {},
        "planted_swapped": {"swap_fc": True},
        "random": {"kind": "random"},
        "moe": {"moe": True},
        "next": {"next": True},
    }.items():
        out[name] = build(root / name, **kw)
    for name in ("planted", "planted_swapped", "random", "moe"):
        out[f"{name}_fp8"] = quantize_mtp(out[name], root / f"{name}_fp8")
    for name in ("planted", "random", "moe", "next"):
        out[f"{name}_fp8_vocab"] = quantize_mtp(
            out[name], root / f"{name}_fp8_vocab", "--draft-vocab", str(ids)
        )
    out["mimo"] = build_mimo_model(root / "mimo")
    out["mimo_swapped"] = build_mimo_model(root / "mimo_swapped", swap_proj=True)
    for name in ("mimo", "mimo_swapped"):
        out[f"{name}_fp8"] = quantize_mtp(out[name], root / f"{name}_fp8")
    out["mimo_fp8_vocab"] = quantize_mtp(out["mimo"], root / "mimo_fp8_vocab", "--draft-vocab", str(ids))
    out["random_fp8_vocab_bf16"] = quantize_mtp(
        out["random"], root / "random_fp8_vocab_bf16", "--draft-vocab", str(ids), "--draft-head-dtype", "bf16"
    )
    return out
