"""A shard's durable write, side by side: through the page cache vs mtpconv's O_DIRECT writer.

    python scripts/bench_write.py [--gib 1] [--repeat 3] [--dir /tmp/mtpconv-bench-write]

Each round writes ``--gib`` GiB of the same 48 MiB block, in 48 MiB writes, to a new
file and fsyncs it, once with a plain ``open(path, "xb")`` and once with
``mtpconv.checkpoint.direct_write.DirectFile`` (alternating which goes first), then
deletes both. Prints wall and system seconds of each write (``getrusage``).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import time
from pathlib import Path

import numpy as np

from mtpconv.checkpoint.direct_write import DirectFile

_BLOCK = 48 << 20


def _buffered(path: Path, block: memoryview, n: int) -> None:
    with open(path, "xb") as f:
        for _ in range(n):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def _direct(path: Path, block: memoryview, n: int) -> None:
    f = DirectFile(path)
    for _ in range(n):
        f.write(block)
    f.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/mtpconv-bench-write"))
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    block = memoryview(np.random.default_rng(0).integers(0, 256, _BLOCK, dtype=np.uint8))
    n = max(1, round(args.gib * (1 << 30) / _BLOCK))
    ways = {"page cache": _buffered, "O_DIRECT": _direct}
    try:
        for r in range(args.repeat):
            order = list(ways) if r % 2 == 0 else list(ways)[::-1]
            for name in order:
                path = args.dir / "out"
                before, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                ways[name](path, block, n)
                wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
                path.unlink()
                gb = n * _BLOCK / 1e9
                sys_s, user_s = after.ru_stime - before.ru_stime, after.ru_utime - before.ru_utime
                label = f"round {r + 1} {name:10s} {gb:.2f} GB"
                print(f"{label}: wall {wall:5.2f} s, sys {sys_s:5.2f} s, user {user_s:5.2f} s")
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
