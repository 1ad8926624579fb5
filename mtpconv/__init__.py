"""mtpconv: an FP8 MTP drafter and a truncated draft vocabulary for MTP checkpoints."""

__version__ = "0.1.0"
