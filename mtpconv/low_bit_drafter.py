"""A drafter already stored below 8 bits, and what converting it to FP8 would cost (issue 47).

FP8 is 8 bits a weight: a drafter whose linears are stored in a narrower storage of
`weight_names.STORAGES` (NVFP4 in either dialect, weights-only NVFP4A16 included; MXFP4;
INT4 pack-quantized or GPTQ/AWQ) would grow, and every draft step would read more bytes
than before. `quantize-mtp` refuses such a drafter unless FP8 is asked for explicitly;
`inspect` reports it. A storage mtpconv cannot dequantize cannot be converted either way
(`unreadable_drafter` says why). Headers only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from mtpconv.checkpoint.safetensors_io import TensorInfo
from mtpconv.formats.scale_layout import stored_scale_shape
from mtpconv.layouts import Linear, MtpLayout
from mtpconv.units import human_bytes
from mtpconv.weight_names import STORAGE, storage_label

CODE_LOW_BIT_DRAFTER = "drafter-below-8-bit"
CODE_UNREADABLE_DRAFTER = "drafter-unreadable"  # stored 8 bits or wider in a format mtpconv cannot read


def _below_8_bits(lin: Linear) -> bool:
    """A packed storage narrower than FP8 (a width only the config could state counts: the
    storages whose width may be unknown pack 1 to 8 bits)."""
    return lin.stored in STORAGE and (lin.bits is None or lin.bits < 8)


def _label(lin: Linear) -> str:
    return storage_label(lin.stored, lin.bits)


@dataclass(frozen=True)
class LowBitDrafter:
    """The drafter linears stored below 8 bits: their formats and sizes now and in FP8."""

    formats: tuple[str, ...]
    linears: int
    of_linears: int  # every drafter linear, for "N of M"
    bytes_now: int  # those linears' weights and scales as stored
    bytes_fp8: int | None  # the same linears as FP8 with the variant's scales (None: a width unknown)

    def describe(self) -> str:
        """One sentence: what is stored and what converting would cost."""
        stored = (
            f"{self.linears} of the drafter's {self.of_linears} linears are already stored "
            f"{' and '.join(self.formats)}: {human_bytes(self.bytes_now)} now"
        )
        if self.bytes_fp8 is None:
            return f"{stored}; their bit width is not declared, so the FP8 size is unknown"
        grow = self.bytes_fp8 - self.bytes_now
        return (
            f"{stored}, {human_bytes(self.bytes_fp8)} as FP8 ({human_bytes(grow)} more, "
            f"{self.bytes_fp8 / max(self.bytes_now, 1):.2f}x), so every draft step would read more"
        )


def low_bit_drafter(layout: MtpLayout, tensors: Mapping[str, TensorInfo]) -> LowBitDrafter | None:
    """The drafter's sub-8-bit linears (None when there are none)."""
    low = [lin for lin in layout.linears if _below_8_bits(lin)]
    if not low:
        return None
    now = sum(tensors[n].nbytes for lin in low for n in (lin.weight, *lin.aux) if n in tensors)
    fp8: int | None = None
    if all(lin.bits is not None for lin in low):
        scales = (stored_scale_shape(lin.scale_layout, lin.shape, lin.fused_halves) for lin in low)
        fp8 = sum(math.prod(lin.shape) for lin in low) + 4 * sum(math.prod(s) for s in scales)  # float32
    formats = tuple(dict.fromkeys(_label(lin) for lin in low))
    return LowBitDrafter(formats, len(low), len(layout.linears), now, fp8)


def unreadable_drafter(layout: MtpLayout) -> str | None:
    """Why the drafter cannot be converted when a linear is stored in a format mtpconv cannot
    dequantize (naming the format and one of its weights); None when every linear can be read."""
    unread = [lin for lin in layout.linears if lin.stored in STORAGE and not STORAGE[lin.stored].readable]
    if not unread:
        return None
    formats = " and ".join(dict.fromkeys(_label(lin) for lin in unread))
    return (
        f"mtpconv cannot read {formats} drafters yet ({len(unread)} of the drafter's "
        f"{len(layout.linears)} linears, e.g. {unread[0].weight}): convert the BF16 release "
        "(or dequantize the drafter first)"
    )
