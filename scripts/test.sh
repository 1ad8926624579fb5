#!/usr/bin/env bash
# The whole test suite, from a fresh clone: sets up .venv (with vLLM for the plugin's
# end-to-end tests), then lint, types and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh --vllm
. .venv/bin/activate
ruff check mtpconv tests scripts benchmarks
mypy mtpconv
python -m pytest -q -p no:cacheprovider "$@"
