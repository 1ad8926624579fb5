"""Tensor names and headers: which tensors are linear weights and how each is stored.

Header-only rules shared by the layout detection, the audit and inspect: the module a
tensor belongs to, whether a weight is a linear vLLM may quantize, and its storage
(`STORAGES`: one row per producer layout, read from the producer's tensor names and
dtypes). A 397B-class checkpoint has ~400k tensors, so these run per tensor and stay
plain string operations.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import Enum

from mtpconv.checkpoint.safetensors_io import (
    BF16,
    F8_E4M3,
    F16,
    F32,
    F64,
    FLOAT_DTYPES,
    FP8_DTYPES,
    I32,
    I64,
    U8,
    TensorInfo,
)
from mtpconv.families.kimi_k3 import PER_EXPERT_W
from mtpconv.families.types import LINEAR_LEAVES, ROUTER_GATE_LEAVES

# Last name component of 2-D modules vLLM never quantizes (lookups, routers; "embeddings": Nemotron-H's
# embed_tokens), and of those we keep out of the FP8 linears too (heads: the draft head is separate).
_NEVER_QUANTIZED = frozenset({"embed_tokens", "embeddings", *ROUTER_GATE_LEAVES, "e_score_correction_bias"})
NOT_LINEAR = _NEVER_QUANTIZED | {"head", "lm_head", "draft_lm_head"}
# ``kv_a_proj_with_mqa``: MLA, fused with ``q_a_proj`` in vLLM (both FP8 or neither)
_LINEAR_NAME = re.compile(
    "(_proj|_proj_with_mqa|" + "|".join(f"^{re.escape(leaf)}" for leaf in LINEAR_LEAVES) + ")$"
)
_FUSED_EXPERTS = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")
# compressed-tensors names: the packed NVFP4 weight and its float32 global scales.
CT_PACKED = ".weight_packed"
_CT_SUFFIXES = (CT_PACKED, ".weight_global_scale", ".input_global_scale")
_INT_DTYPES = frozenset({I32, I64})
_FLOAT_BITS = {F64: 64, F32: 32, F16: 16, BF16: 16}


class Stored(str, Enum):
    """How a linear's weight is stored (a `STORAGES` row, or plain / FP8)."""

    PLAIN = "plain"  # a float tensor (BF16, F16, F32, F64)
    NVFP4 = "nvfp4"  # ModelOpt: packed U8 ``weight`` + E4M3 ``weight_scale`` + ``weight_scale_2``
    # compressed-tensors: ``weight_packed`` + ``weight_scale`` + ``weight_global_scale``
    NVFP4_CT = "nvfp4_ct"
    MXFP4 = "mxfp4"  # packed U8 ``weight`` + U8 (E8M0) ``weight_scale``
    MXFP4_CT = "mxfp4_ct"  # compressed-tensors ``mxfp4-pack-quantized``
    INT_CT = "int_ct"  # compressed-tensors ``pack-quantized`` (llm-compressor W4A16 / W8A16)
    INT_GPTQ = "int_gptq"  # GPTQ / AWQ ``qweight`` + ``qzeros`` + ``scales``
    FP8 = "fp8"  # already FP8: the checkpoint is a variant, not a source

    def __str__(self) -> str:
        return self.value


class StorageFormat(str, Enum):
    """A storage as the audit compares it with a declared algorithm (dialects folded together)."""

    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"
    INT = "int"  # packed integers (compressed-tensors pack-quantized, GPTQ/AWQ)
    FP8 = "fp8"
    PLAIN = "plain"


Shapes = Mapping[str, tuple[int, ...]]  # a weight's sibling tensors' shapes, by leaf


@dataclass(frozen=True)
class Storage:
    """One producer's tensor layout of a quantized linear weight, read from its headers."""

    stored: Stored
    label: str  # how it is named to the user
    weight: str  # the weight tensor's leaf
    dtypes: frozenset[str]  # the weight tensor's dtypes
    needs: Mapping[str, frozenset[str] | None]  # sibling leaves that must be there (-> dtypes; None: any)
    aux: tuple[str, ...]  # sibling leaves that belong to it (scales, zero points, shapes), as found
    bits: Callable[[Shapes], int | None]  # bits a weight; None where only the config says it
    logical: Callable[[Shapes, int], tuple[int, ...]]  # the unpacked [out, in] from the headers and bits
    fmt: StorageFormat  # what the audit compares with a declaration
    readable: bool  # mtpconv dequantizes it


def _packed_last(shapes: Shapes, bits: int, leaf: str, width: int) -> tuple[int, ...]:
    """``bits``-wide values packed ``width`` bits at a time along the last dimension."""
    *lead, cols = shapes[leaf]
    return (*lead, cols * width // bits)


def _ct_int_bits(shapes: Shapes) -> int | None:
    """pack-quantized: an asymmetric zero point is packed along the output rows
    (``[ceil(out * bits / 32), groups]``); a symmetric weight's width is only in the config."""
    zero = shapes.get("weight_zero_point")
    out = shapes["weight_packed"][-2]
    return None if zero is None or len(zero) < 2 else 32 * zero[-2] // max(out, 1)


def _gptq_bits(shapes: Shapes) -> int | None:
    """GPTQ and AWQ both pack ``qzeros`` ``[groups, out * bits / 32]`` (``scales``: ``[groups, out]``)."""
    return 32 * shapes["qzeros"][-1] // max(shapes["scales"][-1], 1)


def _gptq_logical(shapes: Shapes, bits: int) -> tuple[int, ...]:
    """GPTQ packs ``qweight`` along the input (``[in * bits / 32, out]``), AWQ along the
    output (``[in, out * bits / 32]``); ``scales`` ``[groups, out]`` tells them apart."""
    rows, cols = shapes["qweight"][-2:]
    out = shapes["scales"][-1]
    return (out, rows * 32 // bits) if cols == out else (out, rows)


def _fp4_bits(_: Shapes) -> int:
    """NVFP4 and MXFP4 values are 4 bits wide, whatever the headers say."""
    return 4


def _bytes_of(leaf: str) -> Callable[[Shapes, int], tuple[int, ...]]:
    """The logical shape of ``leaf``'s values packed in bytes (``uint8``) along its last dimension."""
    return lambda sh, b: _packed_last(sh, b, leaf, 8)


_U8 = frozenset({U8})
_E4M3 = frozenset({F8_E4M3})
_I32 = frozenset({I32})
# Every sub-8-bit (and packed) storage mtpconv recognises; plain and FP8 weights are read by dtype.
STORAGES: tuple[Storage, ...] = (
    Storage(
        Stored.NVFP4_CT,
        "NVFP4 (4-bit, compressed-tensors)",
        "weight_packed",
        _U8,
        {"weight_scale": _E4M3},
        ("weight_scale", "weight_global_scale", "input_global_scale"),
        _fp4_bits,
        _bytes_of("weight_packed"),
        StorageFormat.NVFP4,
        readable=True,
    ),
    Storage(
        Stored.NVFP4,
        "NVFP4 (4-bit, ModelOpt)",
        "weight",
        _U8,
        {"weight_scale": _E4M3},
        ("weight_scale", "weight_scale_2", "input_scale"),
        _fp4_bits,
        _bytes_of("weight"),
        StorageFormat.NVFP4,
        readable=True,
    ),
    Storage(
        Stored.MXFP4_CT,
        "MXFP4 (4-bit, compressed-tensors)",
        "weight_packed",
        _U8,
        {"weight_scale": _U8},
        ("weight_scale", "input_global_scale"),
        _fp4_bits,
        _bytes_of("weight_packed"),
        StorageFormat.MXFP4,
        readable=False,
    ),
    Storage(
        Stored.MXFP4,
        "MXFP4 (4-bit)",
        "weight",
        _U8,
        {"weight_scale": _U8},
        ("weight_scale", "input_scale"),
        _fp4_bits,
        _bytes_of("weight"),
        StorageFormat.MXFP4,
        readable=False,
    ),
    Storage(
        Stored.INT_CT,
        "INT (compressed-tensors pack-quantized)",
        "weight_packed",
        _I32,
        {"weight_scale": None, "weight_shape": _INT_DTYPES},
        ("weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx", "input_global_scale"),
        _ct_int_bits,
        lambda sh, b: _packed_last(sh, b, "weight_packed", 32),
        StorageFormat.INT,
        readable=False,
    ),
    Storage(
        Stored.INT_GPTQ,
        "INT (GPTQ/AWQ qweight)",
        "qweight",
        _I32,
        {"qzeros": _I32, "scales": None},
        ("qzeros", "scales", "g_idx", "bias"),
        _gptq_bits,
        _gptq_logical,
        StorageFormat.INT,
        readable=False,
    ),
)
STORAGE = {s.stored: s for s in STORAGES}
_WEIGHT_LEAVES = frozenset({"weight"} | {s.weight for s in STORAGES})
_BY_LEAF: dict[str, tuple[Storage, ...]] = {
    leaf: tuple(s for s in STORAGES if s.weight == leaf) for leaf in {s.weight for s in STORAGES}
}


def storage_label(stored: Stored, bits: int | None) -> str:
    """How a storage is named to the user: ``INT4 (compressed-tensors pack-quantized)``."""
    label = STORAGE[stored].label if stored in STORAGE else str(stored).upper()
    return label.replace("INT ", f"INT{bits} ", 1) if bits is not None and label.startswith("INT ") else label


_PARAM_LEAVES = frozenset(
    s.lstrip(".")
    for s in (".weight", ".weight_scale", ".weight_scale_2", ".input_scale", ".bias", *_CT_SUFFIXES)
) | {leaf for s in STORAGES for leaf in (s.weight, *s.aux)}


def module_of(tensor: str) -> str:
    """``a.b.weight`` -> ``a.b``; fused-expert tensors have no suffix to strip."""
    module, dot, leaf = tensor.rpartition(".")
    return module if dot and leaf in _PARAM_LEAVES else tensor


@dataclass(frozen=True)
class WeightStorage:
    """How one weight tensor is stored: its `Stored` kind, the tensors that belong to it, its
    bit width (None: only the config says) and its unpacked shape (None until the width is known)."""

    stored: Stored
    aux: tuple[str, ...]
    bits: int | None
    logical: tuple[int, ...] | None

    @property
    def fmt(self) -> StorageFormat:
        """The storage format the audit compares with a declaration."""
        return STORAGE[self.stored].fmt if self.stored in STORAGE else StorageFormat(self.stored.value)


def storage_of(name: str, tensors: Mapping[str, TensorInfo]) -> WeightStorage | None:
    """How the weight tensor ``name`` is stored (None: not a weight mtpconv knows a storage of)."""
    info = tensors[name]
    module, _, leaf = name.rpartition(".")
    for storage in _BY_LEAF.get(leaf, ()):
        if info.dtype not in storage.dtypes or not all(
            f"{module}.{sib}" in tensors and (dts is None or tensors[f"{module}.{sib}"].dtype in dts)
            for sib, dts in storage.needs.items()
        ):
            continue
        aux = tuple(f"{module}.{a}" for a in storage.aux if f"{module}.{a}" in tensors)
        shapes = {storage.weight: info.shape, **{a.rpartition(".")[2]: tensors[a].shape for a in aux}}
        bits = storage.bits(shapes)
        return WeightStorage(
            storage.stored, aux, bits, None if bits is None else storage.logical(shapes, bits)
        )
    base = module_of(name)
    if info.dtype in FP8_DTYPES:
        aux = tuple(
            n for n in (f"{base}.weight_scale", f"{base}.input_scale", f"{name}_scale") if n in tensors
        )
        return WeightStorage(Stored.FP8, aux, 8, info.shape)
    if info.dtype in FLOAT_DTYPES:
        return WeightStorage(Stored.PLAIN, (), _FLOAT_BITS.get(info.dtype), info.shape)
    return None


def classify_weight(name: str, tensors: Mapping[str, TensorInfo]) -> tuple[str, tuple[str, ...]]:
    """How a weight tensor is stored, as the audit's storage format ("nvfp4" | "mxfp4" | "int" |
    "fp8" | "plain", or "other"), and the tensors that belong to it (`storage_of` for the rest)."""
    found = storage_of(name, tensors)
    return ("other", ()) if found is None else (found.fmt.value, found.aux)


def is_linear_weight(name: str, info: TensorInfo, extra: Collection[str] = ()) -> bool:
    """Whether a tensor is the weight of a drafter linear (its name and its rank)."""
    if _FUSED_EXPERTS.search(name):
        return len(info.shape) == 3
    return name.endswith(".weight") and len(info.shape) == 2 and is_linear_module(module_of(name), extra)


def is_linear_module(module: str, extra: Collection[str] = ()) -> bool:
    """Whether a drafter module's name is one of the linears quantize-mtp makes FP8 (by name
    alone: callers without tensor headers; `detect_layout` also checks the shapes). ``extra``:
    the family row's `linear_leaves` (DeepSeek-V4's ``wq_a`` / ``w1`` ...)."""
    if _FUSED_EXPERTS.search(module) or PER_EXPERT_W.search(module):
        return True
    last = module.rsplit(".", 1)[-1]
    return last not in NOT_LINEAR and (last in extra or bool(_LINEAR_NAME.search(last)))


def linear_modules(tensors: Mapping[str, TensorInfo]) -> dict[str, str]:
    """Every linear-like module of a checkpoint -> how it is stored.

    Linear-like: a 2-D+ weight that vLLM builds as a (possibly quantized)
    linear layer. Embeddings, norms and routers are left out because vLLM never
    quantizes them, so a config need not exclude them.
    """
    out: dict[str, str] = {}
    for name, info in tensors.items():
        if name.endswith((".weight_scale", ".weight_scale_2", ".input_scale", "_scale")):
            continue
        is_weight = name.rpartition(".")[2] in _WEIGHT_LEAVES or _FUSED_EXPERTS.search(name)
        if not is_weight or len(info.shape) < 2:
            continue
        last = module_of(name).rsplit(".", 1)[-1]
        if last in _NEVER_QUANTIZED:
            continue
        stored, _ = classify_weight(name, tensors)
        out[module_of(name)] = stored
    return out


@dataclass(frozen=True)
class CheckpointModules:
    """A checkpoint's modules and its linear-like ones (-> storage), computed once per command."""

    modules: frozenset[str]
    linears: dict[str, str]

    @classmethod
    def of(cls, tensors: Mapping[str, TensorInfo]) -> CheckpointModules:
        """From the checkpoint's tensor headers."""
        return cls(frozenset(module_of(n) for n in tensors), linear_modules(tensors))
