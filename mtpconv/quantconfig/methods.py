"""The names quantization configs are written in, each spelled once: the ``quant_method``
values mtpconv reads and writes, and the ModelOpt ``quant_algo`` values it compares and declares.

Kept free of imports, so every module of `mtpconv.quantconfig` can name them.
"""

from __future__ import annotations

# quant_method (config.json ``quantization_config``; hf_quant_config.json's producer name)
MODELOPT = "modelopt"
COMPRESSED_TENSORS = "compressed-tensors"
FP8_METHOD = "fp8"  # vLLM's Fp8Config: DeepSeek-style FP8 releases

# quant_algo, upper case as ModelOpt writes them and vLLM compares them
MIXED_PRECISION = "MIXED_PRECISION"  # one algorithm per layer, in ``quantized_layers``
FP8 = "FP8"  # static per-tensor FP8; also the algorithm an fp8 or FP8 compressed-tensors config declares
FP8_PER_CHANNEL_PER_TOKEN = "FP8_PER_CHANNEL_PER_TOKEN"  # weight_scale [out], dynamic per-token activations
FP8_PB_WO = "FP8_PB_WO"  # 128x128 weight blocks, dynamic activations
FP8_BLOCK_SCALES = "FP8_BLOCK_SCALES"  # 128x128 weight blocks, dynamic activations (MoE)
NVFP4 = "NVFP4"
W4A16_NVFP4 = "W4A16_NVFP4"
MXFP4 = "MXFP4"
MXFP8 = "MXFP8"
