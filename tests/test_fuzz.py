"""Property-based fuzzing: parsers and rewriters raise only mtpconv's own errors.

Whatever bytes a safetensors header holds, whatever JSON an index or a quant
config holds, the header parser, the index loader and the config rewriters
either return a result or raise an :class:`~mtpconv.errors.MtpconvError`
subclass (which the CLI turns into one ``Error:`` line) — never a bare
``KeyError`` / ``TypeError`` / ``OSError`` that would surface as a traceback.

Runs are derandomized (reproducible in CI) and bounded: about 12,000 cases in
all, well under a minute on two cores.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from mtpconv.checkpoint.index import INDEX_NAME, load_checkpoint_files
from mtpconv.checkpoint.safetensors_io import DTYPE_SIZES, parse_header_bytes, read_header
from mtpconv.errors import MtpconvError
from mtpconv.quantconfig.audit import audit_quant_configs
from mtpconv.quantconfig.declarations import declared_algorithm, declared_quant
from mtpconv.quantconfig.documents import QuantConfigs
from mtpconv.quantconfig.rewrite import fixed_exclusion_configs, variant_configs


def fuzz(n: int) -> Any:
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


# --------------------------------------------------------------------------- JSON-ish values

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=6),
)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
    max_leaves=5,
)

# Cheap non-recursive junk: most of the fuzzing budget goes to running the code, not drawing.
junk = st.one_of(
    scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=3), scalars, max_size=2)
)

# --------------------------------------------------------------------------- safetensors headers

ints = st.one_of(
    st.integers(min_value=0, max_value=64),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, -1]),
)
dtypes = st.one_of(st.sampled_from(sorted(DTYPE_SIZES)), st.text(max_size=6), st.integers(), st.none())
shapes = st.one_of(st.lists(ints, max_size=4), st.lists(junk, max_size=3), junk)
offsets = st.one_of(st.lists(ints, min_size=2, max_size=2), st.lists(junk, max_size=3), junk)
entries = st.one_of(
    st.fixed_dictionaries({"dtype": dtypes, "shape": shapes, "data_offsets": offsets}),
    st.dictionaries(st.sampled_from(["dtype", "shape", "data_offsets", "x"]), junk, max_size=3),
    junk,
)
headers = st.dictionaries(
    st.one_of(st.sampled_from(["a", "b", "__metadata__", "mtp.fc.weight"]), st.text(max_size=10)),
    entries,
    max_size=5,
)


def _check_header(raw: bytes, data_size: int) -> None:
    try:
        header = parse_header_bytes(raw, file="x.safetensors", data_size=data_size, data_start=8)
    except MtpconvError as exc:
        assert "x.safetensors" in str(exc)
        return
    # What it accepted is consistent: inside the data region, sized by dtype x shape, disjoint.
    spans = []
    for t in header.tensors.values():
        assert 8 <= t.start <= t.end <= 8 + data_size
        assert t.end - t.start == math.prod(t.shape) * DTYPE_SIZES[t.dtype]
        if t.end > t.start:
            spans.append((t.start, t.end))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


@fuzz(4000)
@given(raw=st.binary(max_size=200), data_size=st.integers(min_value=0, max_value=4096))
def test_header_parser_arbitrary_bytes(raw: bytes, data_size: int) -> None:
    _check_header(raw, data_size)


@fuzz(2500)
@given(doc=headers, data_size=st.integers(min_value=0, max_value=256))
def test_header_parser_structured(doc: dict[str, Any], data_size: int) -> None:
    _check_header(json.dumps(doc).encode(), data_size)


def _valid_file_bytes() -> bytes:
    import io

    from safetensors.torch import save

    buf = io.BytesIO(
        save(
            {
                "mtp.fc.weight": torch.ones(4, 8, dtype=torch.bfloat16),
                "mtp.norm.weight": torch.ones(4),
                "scale": torch.tensor(1.0),
            },
            metadata={"format": "pt"},
        )
    )
    return buf.getvalue()


VALID = _valid_file_bytes()


@st.composite
def mutated_files(draw: st.DrawFn) -> bytes:
    """A valid safetensors file with a few bytes flipped, inserted, deleted or cut."""
    data = bytearray(VALID)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "length"]))
        pos = draw(st.integers(min_value=0, max_value=max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "set" and data:
            data[pos] = draw(st.sampled_from(b'{}[]",:0123456789-e. \x00\xff'))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(min_value=1, max_value=4))]
        elif op == "truncate":
            del data[pos:]
        elif op == "length":
            data[0:8] = struct.pack("<Q", draw(st.integers(min_value=0, max_value=2**64 - 1)))
    return bytes(data)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@fuzz(2000)
@given(blob=mutated_files())
def test_read_header_mutated_files(blob: bytes, scratch: Path) -> None:
    path = scratch / "m.safetensors"
    path.write_bytes(blob)
    try:
        header = read_header(path)
    except MtpconvError as exc:
        assert "m.safetensors" in str(exc)
        return
    (n,) = struct.unpack("<Q", blob[:8])
    assert header.data_start == 8 + n
    assert all(t.end <= len(blob) for t in header.tensors.values())


# --------------------------------------------------------------------------- the index loader

SHARD_NAMES = ["s1.safetensors", "s2.safetensors"]
shard_refs = st.one_of(
    st.sampled_from(SHARD_NAMES),
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "../s1.safetensors",
            "/etc/passwd",
            "sub/",
            "s1.safetensors/",
            "./s1.safetensors",
            "a\\b",
            "x\x00y",
            "missing.safetensors",
            "config.json",
            "s" * 300,
            "d/" * 60 + "s1.safetensors",
            "loop",
            "dir",
        ]
    ),
    st.text(max_size=20),
    junk,
)
tensor_names = st.one_of(st.sampled_from(["a", "b", "c", ""]), st.text(max_size=6))
index_docs = st.one_of(
    st.fixed_dictionaries(
        {"weight_map": st.one_of(st.dictionaries(tensor_names, shard_refs, max_size=4), json_values)},
        optional={"metadata": json_values},
    ),
    json_values,
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fuzz_ckpt")
    save_file({"a": torch.zeros(2)}, str(d / "s1.safetensors"))
    save_file({"b": torch.zeros(3), "c": torch.ones(1)}, str(d / "s2.safetensors"))
    (d / "config.json").write_text("{}")
    (d / "dir").mkdir()
    (d / "loop").symlink_to(d / "loop")
    return d


@fuzz(1500)
@given(doc=index_docs, raw=st.booleans(), text=st.text(max_size=40))
def test_index_loader_arbitrary_json(doc: Any, raw: bool, text: str, ckpt: Path) -> None:
    (ckpt / INDEX_NAME).write_text(text if raw else json.dumps(doc), encoding="utf-8")
    try:
        files = load_checkpoint_files(ckpt)
    except MtpconvError:
        return
    assert set(files.weight_map) <= {"a", "b", "c"}
    assert set(files.weight_map.values()) <= set(SHARD_NAMES)


# --------------------------------------------------------------------------- config rewriters

MODULES = [
    "mtp.fc",
    "mtp.layers.0.self_attn.q_proj",
    "mtp.layers.0.mlp.experts.0.up_proj",
    "model.language_model.mtp.fc",
    "model.layers.0.self_attn.o_proj",
    "model.layers.1.mlp.gate",
    "lm_head",
    "model.visual.blocks.0.attn.qkv",
]
patterns = st.one_of(
    st.sampled_from(
        [
            "lm_head",
            "mtp*",
            "mtp.layers.0*",
            "model.visual*",
            "*",
            "re:mtp\\..*",
            "re:[",
            "re:(",
            "*.mlp.gate",
            "[",
            "mtp.fc",
        ]
    ),
    st.text(max_size=8),
)
algos = st.one_of(st.sampled_from(["NVFP4", "FP8", "MIXED_PRECISION", "nvfp4", "W4A16"]), junk)
methods = st.one_of(st.sampled_from(["modelopt", "compressed-tensors", "fp8", "gptq", "", "MODELOPT"]), junk)
maybe = st.one_of(st.lists(patterns, max_size=4), junk)
layer_maps = st.one_of(
    st.dictionaries(
        st.sampled_from(MODULES + ["mtp", "model.layers.0"]),
        st.one_of(st.fixed_dictionaries({"quant_algo": algos}), junk),
        max_size=3,
    ),
    junk,
)
quantization = st.fixed_dictionaries(
    {},
    optional={
        "quant_algo": algos,
        "exclude_modules": maybe,
        "kv_cache_quant_algo": algos,
        "quantized_layers": layer_maps,
        "group_size": junk,
    },
)
ct_groups = st.dictionaries(
    st.text(max_size=4),
    st.one_of(
        st.fixed_dictionaries(
            {
                "targets": st.one_of(st.lists(patterns, max_size=3), junk),
                "weights": st.one_of(
                    st.fixed_dictionaries(
                        {
                            "num_bits": st.sampled_from([4, 8, "8"]),
                            "type": st.sampled_from(["float", "int", 3]),
                        }
                    ),
                    junk,
                ),
            }
        ),
        junk,
    ),
    max_size=2,
)
qc = st.fixed_dictionaries(
    {},
    optional={
        "quant_method": methods,
        "quant_algo": algos,
        "ignore": maybe,
        "ignored_layers": maybe,
        "modules_to_not_convert": maybe,
        "quantization": st.one_of(quantization, junk),
        "quantized_layers": layer_maps,
        "config_groups": st.one_of(ct_groups, junk),
        "kv_cache_scheme": junk,
    },
)
configs = st.fixed_dictionaries(
    {"model_type": st.sampled_from(["qwen3_5", "qwen3_next"])},
    optional={
        "quantization_config": st.one_of(qc, junk),
        "text_config": st.one_of(st.fixed_dictionaries({}, optional={"quantization_config": qc}), junk),
        "compression_config": st.one_of(qc, junk),
    },
)
hf_quants = st.one_of(  # the loader refuses anything but an object
    st.none(),
    st.fixed_dictionaries({"producer": junk}, optional={"quantization": st.one_of(quantization, junk)}),
    st.dictionaries(st.text(max_size=4), junk, max_size=3),
)
stored = st.dictionaries(st.sampled_from(MODULES), st.sampled_from(["plain", "nvfp4", "fp8"]), max_size=8)


@fuzz(2500)
@given(
    config=configs,
    hf_quant=hf_quants,
    stored_map=stored,
    drafter=st.sets(st.sampled_from(MODULES), max_size=4),
)
def test_config_rewriters_arbitrary_json(
    config: dict[str, Any], hf_quant: Any, stored_map: dict[str, str], drafter: set[str]
) -> None:
    before = json.dumps([config, hf_quant], sort_keys=True)
    qcs = QuantConfigs(config=config, hf_quant=hf_quant)
    findings = audit_quant_configs(qcs, stored_map, drafter, all_modules=MODULES)
    assert all(f.code for f in findings)
    try:
        decl = declared_quant(qcs)
        for m in MODULES:
            declared_algorithm(decl, m)
    except MtpconvError:
        pass
    for rewrite in (
        lambda: variant_configs(qcs, sorted(drafter), MODULES).documents,
        lambda: fixed_exclusion_configs(qcs, stored_map).documents,
    ):
        try:
            new_hf, new_cfg = rewrite()
        except MtpconvError:
            continue
        json.dumps([new_cfg, new_hf])  # still serialisable
        assert list(new_cfg) == list(config)  # key order kept
    assert json.dumps([config, hf_quant], sort_keys=True) == before, "inputs were mutated"
