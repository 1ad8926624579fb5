"""Write the tiny bundled example checkpoint used by scripts/demo.sh.

A NVIDIA-style NVFP4 Qwen3.5-MoE VLM checkpoint (3 shards) whose MTP drafter is
stored BF16 while its quant config excludes only ``mtp.layers.0*`` (the real
``mtp.fc`` gap), with a small byte-level BPE tokenizer. Deterministic; offline.

    python scripts/make_example.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from fixtures.checkpoints import Spec, write_checkpoint
from fixtures.tokenizers import write_tiny_tokenizer


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/make_example.py OUT_DIR")
    out = Path(sys.argv[1])
    write_checkpoint(out, Spec(family="qwen3_5_moe", quant="nvfp4", vlm=True, shards=3, vocab=512))
    write_tiny_tokenizer(out, vocab_size=512)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
