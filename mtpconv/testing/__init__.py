"""Tiny real checkpoints and tokenizers, built offline.

The test suite, the bundled example (``scripts/make_example.py``), the benchmarks
and the vLLM acceptance scripts all build their models here, so a checkpoint
layout is written once. Nothing here downloads anything.
"""
