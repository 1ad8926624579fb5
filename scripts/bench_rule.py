"""The skinny GEMM's rule for shapes not in its table, against the sweep's best (CUDA).

    PYTHONPATH=$PWD python3 scripts/bench_rule.py --tokens 1,4,16

``triton_skinny.default_config`` takes the tuned configuration for the benchmarked
Qwen3.5 / Qwen3-Next shapes and a rule for every other shape. This times the rule on
the FP8 dense linears of other families' MTP drafters (shapes below, from their
config.json) against every configuration ``bench_draft.py --sweep`` tries, each timed the
same way (CUDA graph, weight copies rotated past L2), and prints per (linear, tokens) the
rule's time, the previous rule's (``previous_rule``), the best time and configuration,
and the rule's loss.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_draft as bd  # noqa: E402

from mtpconv.kernels import triton_skinny as ts  # noqa: E402

# (family, linear) -> (N, K)
OTHER = {
    # DeepSeek-V3 MTP layer: hidden 7168, MLA (q_lora 1536, kv_lora 512, 128 heads of
    # 128 + 64 rope), shared expert 2048
    ("DeepSeek-V3", "eh_proj"): (7168, 14336),
    ("DeepSeek-V3", "q_a"): (1536, 7168),
    ("DeepSeek-V3", "q_b"): (24576, 1536),
    ("DeepSeek-V3", "kv_a"): (576, 7168),
    ("DeepSeek-V3", "kv_b"): (32768, 512),
    ("DeepSeek-V3", "o"): (7168, 16384),
    ("DeepSeek-V3", "shared_gate_up"): (4096, 7168),
    ("DeepSeek-V3", "shared_down"): (7168, 2048),
    # GLM-4.5: hidden 5120, 96 q heads / 8 kv heads of 128, shared expert 1536
    ("GLM-4.5", "o"): (5120, 12288),
    ("GLM-4.5", "shared_gate_up"): (3072, 5120),
    ("GLM-4.5", "shared_down"): (5120, 1536),
    # MiMo-7B: hidden 4096, 32 q / 8 kv heads of 128, dense intermediate 11008
    ("MiMo-7B", "qkv"): (6144, 4096),
    ("MiMo-7B", "o"): (4096, 4096),
    ("MiMo-7B", "gate_up"): (22016, 4096),
    ("MiMo-7B", "down"): (4096, 11008),
    # held out: not used to set the rule (GLM-4.5-Air: hidden 4096, 96 q / 8 kv heads of
    # 128, shared expert 1408; a dense 70B-class layer: hidden 8192, 64 q / 8 kv heads)
    ("GLM-4.5-Air (held out)", "o"): (4096, 12288),
    ("GLM-4.5-Air (held out)", "shared_gate_up"): (2816, 4096),
    ("GLM-4.5-Air (held out)", "shared_down"): (4096, 1408),
    ("dense 8192 (held out)", "qkv"): (10240, 8192),
    ("dense 8192 (held out)", "down"): (8192, 28672),
}


def previous_rule(m: int, n: int, k: int, sms: int) -> ts.Config:
    """``default_config``'s rule for untabled shapes before this script's sweep (d27e54a)."""
    if m > 1:
        return ts.Config(True, 64, 128, 4, 3, 4 * sms, 2)
    if k >= 4096:
        return ts.Config(False, 8, 1024, 4, 3, 4 * sms, narrow=True)
    return ts.default_config(m, n, k, sms)  # unchanged below K = 4096


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,4,16")
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = ts.sm_count(0)
    gen = torch.Generator(device=dev).manual_seed(0)
    losses = []
    for (family, name), (n, k) in OTHER.items():
        assert all((b, n, k) not in ts.TUNED for b in (1, 4, 16)), (family, name)
        copies = max(2, math.ceil(bd.L2_SAFE_BYTES / (n * k)))
        ws = [bd.Linear.make(n, k, dev, gen) for _ in range(copies)]
        for t in [int(v) for v in args.tokens.split(",")]:
            x = torch.randn(t, k, device=dev, generator=gen).to(torch.bfloat16)
            rule, previous = ts.default_config(t, n, k, sms), previous_rule(t, n, k, sms)
            res = bd.time_skinny(x, ws, [rule, previous, *bd.skinny_configs(t, sms)], f"{n}x{k} T={t}")
            timed = {cfg: us for us, cfg in res}
            best = min(res, key=lambda r: r[0])
            loss = timed[rule] / best[0] - 1
            losses.append((loss, timed[previous] / best[0] - 1))
            tbps = n * k / best[0] / 1e6
            print(
                f"{family} {name} {n}x{k} T={t}: rule {timed[rule]:.1f} us {tuple(rule)} | previous rule "
                f"{timed[previous]:.1f} us | best {best[0]:.1f} us ({tbps:.2f} TB/s) {tuple(best[1])} "
                f"| rule +{100 * loss:.0f}%",
                flush=True,
            )
        del ws
        torch.cuda.empty_cache()
    for i, what in enumerate(("rule", "previous rule")):
        v = sorted(x[i] for x in losses)
        print(f"{what}'s loss against the best: median {100 * v[len(v) // 2]:.0f}%, max {100 * v[-1]:.0f}%")


if __name__ == "__main__":
    main()
