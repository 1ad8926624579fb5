"""A drafter already stored below 8 bits, and what converting it to FP8 would cost (issue 47).

FP8 is 8 bits a weight: a drafter whose linears are stored 4-bit (NVFP4 in either dialect,
weights-only NVFP4A16 included) would grow, and every draft step would read more bytes than
before. `quantize-mtp` refuses such a drafter unless FP8 is asked for explicitly; `inspect`
reports it. Headers only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from mtpconv.checkpoint.safetensors_io import TensorInfo
from mtpconv.formats.scale_layout import stored_scale_shape
from mtpconv.layouts import MtpLayout, Stored
from mtpconv.units import human_bytes

CODE_LOW_BIT_DRAFTER = "drafter-below-8-bit"
# How each sub-8-bit storage is named to the user.
_FORMAT_NAMES = {
    Stored.NVFP4: "NVFP4 (4-bit, ModelOpt)",
    Stored.NVFP4_CT: "NVFP4 (4-bit, compressed-tensors)",
}


@dataclass(frozen=True)
class LowBitDrafter:
    """The drafter linears stored below 8 bits: their formats and sizes now and in FP8."""

    formats: tuple[str, ...]
    linears: int
    of_linears: int  # every drafter linear, for "N of M"
    bytes_now: int  # those linears' weights and scales as stored
    bytes_fp8: int  # the same linears as FP8 weights with the scales the variant would store

    def describe(self) -> str:
        """One sentence: what is stored and what converting would cost."""
        grow = self.bytes_fp8 - self.bytes_now
        return (
            f"{self.linears} of the drafter's {self.of_linears} linears are already stored "
            f"{' and '.join(self.formats)}: {human_bytes(self.bytes_now)} now, "
            f"{human_bytes(self.bytes_fp8)} as FP8 ({human_bytes(grow)} more, "
            f"{self.bytes_fp8 / max(self.bytes_now, 1):.2f}x), so every draft step would read more"
        )


def low_bit_drafter(layout: MtpLayout, tensors: Mapping[str, TensorInfo]) -> LowBitDrafter | None:
    """The drafter's sub-8-bit linears (None when there are none)."""
    low = [lin for lin in layout.linears if lin.stored in _FORMAT_NAMES]
    if not low:
        return None
    now = sum(tensors[n].nbytes for lin in low for n in (lin.weight, *lin.aux) if n in tensors)
    scales = (stored_scale_shape(lin.scale_layout, lin.shape, lin.fused_halves) for lin in low)
    fp8 = sum(math.prod(lin.shape) for lin in low) + 4 * sum(math.prod(s) for s in scales)  # float32
    formats = tuple(dict.fromkeys(_FORMAT_NAMES[lin.stored] for lin in low))
    return LowBitDrafter(formats, len(low), len(layout.linears), now, fp8)
