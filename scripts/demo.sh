#!/usr/bin/env bash
# The main job on a tiny bundled example, offline: build a tiny NVIDIA-style NVFP4
# Qwen3.5-MoE checkpoint (with the real mtp.fc exclusion gap), inspect it, build a
# draft vocabulary from a small corpus, write the -mtpfp8 variant, inspect the variant.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
. .venv/bin/activate
out=${1:-out/demo}
rm -rf "$out"
python scripts/make_example.py "$out/tiny-qwen3.5-moe-nvfp4"
mtpconv inspect "$out/tiny-qwen3.5-moe-nvfp4"
mtpconv build-draft-vocab "$out/tiny-qwen3.5-moe-nvfp4" --corpus examples/corpus.jsonl \
    --size 128 --output "$out/draft_vocab.pt"
mtpconv quantize-mtp "$out/tiny-qwen3.5-moe-nvfp4" "$out/tiny-qwen3.5-moe-nvfp4-mtpfp8" \
    --draft-vocab "$out/draft_vocab.pt"
mtpconv inspect "$out/tiny-qwen3.5-moe-nvfp4-mtpfp8"
