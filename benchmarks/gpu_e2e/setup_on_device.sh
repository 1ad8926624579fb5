#!/usr/bin/env bash
# On the device machine, from the project root: assemble the bundle parts copied to /tmp/vb
# (python -m benchmarks.gpu_e2e.bundle) into /tmp/vsite: vLLM, its light dependencies and mtpconv's
# wheel (whose entry point registers the plugin). Idempotent: a second call on a warm machine
# only checks. Then: export PYTHONPATH=$PWD:/tmp/vsite (the project's working tree first, so the
# code under test is this checkout's; VLLM_PLUGINS without mtpconv switches the plugin off).
set -euo pipefail
REPO=$(pwd)
if [ ! -d /tmp/vsite/vllm ]; then
  cd /tmp/vb
  if [ -f SHA256SUMS ]; then sha256sum -c --quiet SHA256SUMS; fi
  cat p0* > bundle.tar && tar xf bundle.tar && rm -f bundle.tar p0*
  mkdir -p /tmp/vsite
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/vsite bundle/wheels/*.whl
  if command -v zstd >/dev/null; then zstd -dc bundle/vllm.tar.zst | tar xf - -C /tmp/vsite
  else python3 -m pip install -q --no-index --no-deps --target /tmp/zs "$REPO"/.gpuv/zstandard-*.whl
       PYTHONPATH=/tmp/zs python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(open('bundle/vllm.tar.zst', 'rb'), sys.stdout.buffer)" | tar xf - -C /tmp/vsite
  fi
  rm -rf bundle
  cd "$REPO"
fi
# Wheels carried beside the parts (.gpuv/*.whl other than zstandard) go in too.
for w in "$REPO"/.gpuv/*.whl; do
  case $w in *zstandard-*|*'*'*) ;; *) python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite "$w" ;; esac
done
PYTHONPATH="$REPO:/tmp/vsite" python3 -c "import torch, vllm; print('vLLM', vllm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
