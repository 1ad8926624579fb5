"""Number formats: FP8 e4m3 per-tensor and NVFP4 (ModelOpt) math, pure torch."""
