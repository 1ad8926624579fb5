#!/usr/bin/env bash
# One GPU end-to-end stage on the device machine, from the project root, after setup_on_device.sh:
#   benchmarks/gpu_e2e/run_on_device.sh mimo|next [default|v1|v2]
# Builds the real-shape planted checkpoint (planted_real.py; LAYERS= overrides the depth: mimo 36,
# next 8), converts it with the real CLI on the GPU (with a 32k FP8 draft head from
# examples/corpus.jsonl), then runs `mtpconv eval` (k = 3, batch 1 and 8, 128 tokens, vLLM's
# defaults: torch.compile and CUDA graphs) on the runner asked for (default: vLLM's choice;
# v1 / v2 set VLLM_USE_V2_MODEL_RUNNER). ROWS= limits the rows (ROWS=none: no eval). PROFILE=row,row
# then splits a batch-1 step of each row named (step_profile.py: target, drafter, head, idle) into
# $OUT/<name>-profile-<row>.json. Writes $OUT/<name>.json (the report; <name> is
# <stage>-<runner>, then -<tag> where TAG= is set), $OUT/<name>-logs.tgz (each row's log and
# result) and $OUT/triton-autotune.tgz (see TRITON_CACHE_AUTOTUNING below). The checkpoints
# stay in /tmp/e2e for the next stage on a warm machine. Ends before the device's 600 s call
# limit (DEADLINE= seconds, default 570): a row still running then is stopped and its log kept.
# ENGINE_ARGS="k=v k=v" adds engine arguments to every row (for example enforce_eager=true);
# TAG= names the run in its output files (<stage>-<runner>-<tag>...), so one call can hold several.
set -uo pipefail
STAGE=${1:?stage: mimo or next}
RUNNER=${2:-default}
END=$((SECONDS + ${DEADLINE:-570}))
export PYTHONPATH="$PWD:/tmp/vsite" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# The bundle carries no FlashInfer: vLLM's top-k/top-p sampler (unused by greedy decoding) must not
# look for it (Model Runner V2 imports FlashInfer's attention backend to ask otherwise).
export VLLM_USE_FLASHINFER_SAMPLER=0
# Triton keeps its autotuning results on disk (~/.triton/cache), so each row after the first
# reuses them: Qwen3-Next's Gated-DeltaNet kernels autotune in vLLM's profiling run (143 s of
# the first V2 row's start-up). Every row then runs the same kernel configurations.
export TRITON_CACHE_AUTOTUNING=1
# Those results outlive the machine: each stage writes them to $OUT/triton-autotune.tgz. A copy
# committed as benchmarks/gpu_e2e/triton-autotune/<card>.tgz (it travels with every checkout) or
# carried as .gpuv/triton-autotune.tgz (this session only) seeds a fresh machine's cache: a first
# row then compiles each kernel's best configuration only. Triton (3.6, runtime/autotuner.py)
# keys each result by its own version, ptxas's version and the GPU architecture, the kernel's
# source and the configurations tried: results from another Triton are never read, but the H100
# and the H200 (both sm_90) read each other's, so every row of a run still runs the same
# configurations, which need not be that card's best.
TRITON_DIR=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
mkdir -p "$TRITON_DIR"
for seed in benchmarks/gpu_e2e/triton-autotune/*.tgz .gpuv/triton-autotune.tgz; do
  [ -f "$seed" ] || continue
  tar xzf "$seed" -C "$TRITON_DIR"
done
OUT=${OUT:-/tmp/e2e-out}
mkdir -p "$OUT" /tmp/e2e
case $RUNNER in
  v1) export VLLM_USE_V2_MODEL_RUNNER=0 ;;
  v2) export VLLM_USE_V2_MODEL_RUNNER=1 ;;
  default) ;;
  *) echo "runner: default, v1 or v2" >&2; exit 2 ;;
esac
case $STAGE in
  mimo) SHAPE=mimo-7b; LAYERS=${LAYERS:-36}; ENGINE=(--engine-arg trust_remote_code=true) ;;
  next) SHAPE=qwen3-next-80b; LAYERS=${LAYERS:-8}
        # GDN prefill: FlashInfer's is JIT-built and the bundle carries no FlashInfer; Triton/FLA.
        ENGINE=(--engine-arg gdn_prefill_backend=triton) ;;
  *) echo "stage: mimo or next" >&2; exit 2 ;;
esac
# Both variants get the 32k FP8 draft head (the plugin row); stock vLLM never loads it, so the
# stock row serves the same variant with the full head.
HEAD=(--draft-vocab "/tmp/e2e/$SHAPE.ids.pt")
ENGINE+=(--engine-arg max_model_len=4096)
# Model Runner V2's kernel warmup (vLLM 0.26) prefills up to max_num_seqs requests after the KV
# cache is sized, outside vLLM's memory profile: on Qwen3-Next, 2 GiB of Gated-DeltaNet states at
# once. At vLLM's default utilization the variant-plugin row ran out of memory there (H100,
# 2026-12-07), so every V2 row of this stage leaves vLLM more room.
[ "$STAGE.$RUNNER" = next.v2 ] && ENGINE+=(--engine-arg gpu_memory_utilization=0.88)
for arg in ${ENGINE_ARGS:-}; do ENGINE+=(--engine-arg "$arg"); done
NAME=$STAGE-$RUNNER${TAG:+-$TAG}
SRC=/tmp/e2e/$SHAPE-L$LAYERS
VAR=$SRC-mtpfp8
MTPCONV=(python3 -m mtpconv)
t0=$SECONDS
[ -f "$SRC/config.json" ] || python3 -m benchmarks.gpu_e2e.planted_real "$SRC" --shape "$SHAPE" --layers "$LAYERS" || exit 1
if [ ! -f "/tmp/e2e/$SHAPE.ids.pt" ]; then
  "${MTPCONV[@]}" -q build-draft-vocab "$SRC" --corpus examples/corpus.jsonl --size 32768 -o "/tmp/e2e/$SHAPE.ids.pt" || exit 1
fi
[ -f "$VAR/mtpconv.json" ] || "${MTPCONV[@]}" quantize-mtp "$SRC" "$VAR" --device cuda "${HEAD[@]}" || exit 1
echo "checkpoints ready in $((SECONDS - t0)) s; $(du -sh "$SRC" | cut -f1) source" >&2
export TMPDIR=/tmp/e2e/rows-$NAME
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
rc=0
[ "${ROWS:-}" = none ] || timeout $((END - SECONDS)) "${MTPCONV[@]}" eval "$SRC" "$VAR" -k 3 --batch 1,8 --max-tokens 128 \
  ${ROWS:+--rows "$ROWS"} "${ENGINE[@]}" --json --no-save \
  > "$OUT/$NAME.json" || rc=$?
[ "${ROWS:-}" = none ] || python3 -m benchmarks.gpu_e2e.summarize "$OUT/$NAME.json" >&2
for row in ${PROFILE:+${PROFILE//,/ }}; do
  case $row in variant-*) MODEL=$VAR ;; *) MODEL=$SRC ;; esac
  timeout $((END - SECONDS)) python3 -m benchmarks.gpu_e2e.step_profile "$MODEL" --row "$row" -k 3 \
    --out "$OUT/$NAME-profile-$row.json" "${ENGINE[@]}" \
    > "$TMPDIR/profile-$row.log" 2>&1 || rc=$?
  grep -A3 "^$row on" "$TMPDIR/profile-$row.log" >&2
done
tar czf "$OUT/$NAME-logs.tgz" -C "$TMPDIR" . 2>/dev/null
(cd "$TRITON_DIR" && find . -name '*.autotune.json' | tar czf "$OUT/triton-autotune.tgz" -T -)
echo "stage $NAME ended with $rc after $SECONDS s" >&2
exit $rc
