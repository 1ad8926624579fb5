"""Put this folder on PYTHONPATH: every Python process then applies the vLLM-CPU stub."""

from mtpconv.testing.vllm_stub import apply

apply()
