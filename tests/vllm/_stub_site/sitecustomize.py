"""Test-only (tests/vllm): applies the torchvision stub in processes vLLM spawns."""

import _mtpconv_vllm_test_stub

_mtpconv_vllm_test_stub.apply()
