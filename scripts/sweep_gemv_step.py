"""One-token narrow-GEMV table candidates, alone and inside the drafter step (CUDA).

    PYTHONPATH=$PWD python3 scripts/sweep_gemv_step.py --out OUTDIR --model qwen3.5-397b-a17b \
        --shapes 4096x8192,32768x4096

For each shape (``N x K`` of a dense FP8 linear at one token): the narrow GEMV with 2-8 row
tiles, K steps of 512-2048 and the first 0-2 K steps' weight tiles loaded before the PDL wait
(``first_ahead``), beside the table's entry (``skinny_tuned.TUNED``) with each ``first_ahead``,
each timed as ``bench_draft.py --micro`` times a linear, in two rounds. A shape whose best beats
the table's entry by more than ``--gain`` takes that best in the ``+GEMV_ONE_TOKEN=...``
variants (``skinny_tuned.one_token_setting``): the model's step at one token as
``bench_draft.py`` times it, ``bf16``, ``auto`` and both again with the best swapped in, side by
side (the BF16 steps read no FP8 table: their two columns show the spread). Writes
OUTDIR/sweep_gemv_step.json and prints the table entries it would write and the setting that
times them in ``bench_draft.py`` (``--variants "bf16,auto,auto+GEMV_ONE_TOKEN=..."``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_draft as bd  # noqa: E402

from mtpconv.kernels import skinny_tuned  # noqa: E402
from mtpconv.kernels.skinny_tuned import Entry, narrow_entry  # noqa: E402
from mtpconv.kernels.triton_skinny import Config, _tabled, default_config, skinny_linear, sm_count  # noqa: E402


def candidates(current: Entry) -> list[tuple[Entry, int]]:
    """``(table entry, first_ahead)`` pairs: narrow tiles of 2-8 rows with K steps of 256 x warps,
    and the current entry, each with 0-2 K steps ahead."""
    tiles = [(bn, bk, warps) for bn in (2, 4, 8) for bk, warps in ((512, 2), (1024, 4), (2048, 8))]
    entries: list[Entry] = [narrow_entry(bn, bk, warps, 4) for bn, bk, warps in tiles]
    if current not in entries:
        entries.append(current)
    return [(e, first) for e in entries for first in (0, 1, 2)]


def sweep_shape(n: int, k: int, dev: torch.device, rounds: int = 2) -> dict[str, Any]:
    """Mean us of the table's configuration and of every candidate at one token."""
    sms = sm_count(dev.index or 0)
    gen = torch.Generator(device=dev).manual_seed(0)
    copies = max(2, math.ceil(bd.L2_SAFE_BYTES / (n * k)))
    ws = [bd.Linear.make(n, k, dev, gen) for _ in range(copies)]
    x = torch.randn(1, k, device=dev, generator=gen).to(torch.bfloat16)

    def us(cfg: Config) -> float:
        def g() -> None:
            for w in ws:
                skinny_linear(x, w.fp8, w.scale, config=cfg)

        return bd.time_graph(g, reps=1) / copies

    table = default_config(1, n, k, sms)
    cands = candidates(skinny_tuned.TUNED[(1, n, k)])
    times: dict[int, list[float]] = {}
    base: list[float] = []
    for _ in range(rounds):
        base.append(us(table))
        for i, (entry, first) in enumerate(cands):
            times.setdefault(i, []).append(us(_tabled(entry, sms)._replace(first_ahead=first)))
    ws.clear()  # the weight copies go before the next shape's
    torch.cuda.empty_cache()
    ranked = sorted((sum(t) / len(t), i) for i, t in times.items())
    return {
        "n": n,
        "k": k,
        "table": [list(skinny_tuned.TUNED[(1, n, k)]), table.first_ahead],
        "table_us": sum(base) / len(base),
        "ranked": [[t, list(cands[i][0]), cands[i][1]] for t, i in ranked],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="qwen3.5-397b-a17b", choices=list(bd.SHAPES))
    ap.add_argument("--shapes", required=True, help="NxK of the model's one-token linears, comma-separated")
    ap.add_argument("--gain", type=float, default=0.02, help="least gain over the table's entry")
    args = ap.parse_args(argv)
    linears = bd.dense_shapes(bd.SHAPES[args.model])
    shapes = []
    for text in args.shapes.split(","):
        n_k = tuple(int(v) for v in text.split("x") if v.isdigit())
        if len(n_k) != 2 or text != f"{n_k[0]}x{n_k[1]}":
            ap.error(f"--shapes: {text!r} is not NxK (for example 4096x8192)")
        if n_k not in linears.values() or (1, *n_k) not in skinny_tuned.TUNED:
            tabled = dict.fromkeys(v for v in linears.values() if (1, *v) in skinny_tuned.TUNED)
            known = ", ".join(f"{n}x{k}" for n, k in tabled)
            ap.error(f"--shapes: {text} is not a tabled one-token linear of {args.model} ({known})")
        shapes.append(n_k)
    if not torch.cuda.is_available():
        print("sweep_gemv_step needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    swept, chosen = [], {}
    for n, k in shapes:
        r = sweep_shape(n, k, dev)
        swept.append(r)
        best_us, entry, first = r["ranked"][0]
        print(f"{n}x{k}: table {r['table']} {r['table_us']:.2f} us ({n * k / r['table_us'] / 1e6:.2f} TB/s)")
        for t, e, f in r["ranked"][:5]:
            print(f"    {e[1:4]} first {f}: {t:.2f} us ({n * k / t / 1e6:.2f} TB/s)", flush=True)
        best = {(n, k): (tuple(entry), first)}
        if best_us < (1 - args.gain) * r["table_us"] and skinny_tuned.one_token_setting(best) is not None:
            chosen.update(best)  # a best the setting can name (the table's own entry may not be narrow)
    for (n, k), (entry, first) in chosen.items():
        print(f"    {(1, n, k)}: {entry},  # first_ahead {first}")
    setting = skinny_tuned.one_token_setting(chosen) if chosen else None
    if setting:
        print(f"    {skinny_tuned.ONE_TOKEN_ENV}={setting}")
    copy = bd.copy_bandwidth(dev)
    variants = ["bf16", "auto"]
    if setting:  # the BF16 step reads no FP8 table: its second column shows the spread
        variants += [f"bf16+GEMV_ONE_TOKEN={setting}", f"auto+GEMV_ONE_TOKEN={setting}"]
    rows = bd.bench_model(args.model, [1], variants, copy, dev)
    result = {
        "device": torch.cuda.get_device_name(dev),
        "copy_tbps": copy,
        "command": " ".join(sys.argv),
        "swept": swept,
        "chosen": [[[1, *key], list(e), f] for key, (e, f) in chosen.items()],
        "setting": setting,
        "steps": [r.__dict__ for r in rows],
    }
    (args.out / "sweep_gemv_step.json").write_text(json.dumps(result, indent=1))
    for r in rows:
        if r.head == "32k":
            print(f"step {r.variant} {r.us:7.1f} us (queued {r.extra['us_queued']:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
