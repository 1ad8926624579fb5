"""Bad inputs across every command: one ``Error:`` line, exit 1, nothing changed or left.

Each case builds its own little world under one directory (source checkpoint,
destination parent, corpora, ...), runs one ``mtpconv`` command in-process and
asserts: exit code 1, exactly one ``Error:`` line on stderr that names the
offending file or tensor, no traceback, and the whole world byte-for-byte (and
entry-for-entry, hidden temp dirs and lock files included) as it was before.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fixtures.checkpoints import Spec, write_checkpoint
from fixtures.tokenizers import write_tiny_tokenizer
from mtpconv.commands.quantize_mtp import quantize_mtp
from tests.helpers import run_cli

INDEX = "model.safetensors.index.json"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


# --------------------------------------------------------------------------- helpers


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (hidden ones included), without following links or
    opening anything that is not a regular file: path -> kind and content digest."""
    import hashlib

    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(path)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            elif stat.S_ISREG(st.st_mode):
                out[rel] = "file:" + hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[rel] = f"special:{stat.S_IFMT(st.st_mode)}"
    return out


def _rewrite_header(path: Path, edit: Callable[[dict], None]) -> None:
    """Apply ``edit`` to the JSON header of a safetensors file, keeping its data bytes."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])


def _index(src: Path) -> dict:
    return json.loads((src / INDEX).read_text())


def _write_index(src: Path, doc: object) -> None:
    (src / INDEX).write_text(doc if isinstance(doc, str) else json.dumps(doc))


def _poison(src: Path, name: str, value: float) -> None:
    file = src / "model.safetensors"
    t = load_file(str(file))
    t[name] = t[name].clone()
    t[name][0, 0] = value
    save_file(t, str(file), metadata={"format": "pt"})


@dataclass
class Case:
    args: list[str]
    names: list[str]  # what the one Error line must mention (file, tensor, hint)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def small_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BF16 Qwen3.5 dense checkpoint in one file (tiny, fast to convert)."""
    return write_checkpoint(tmp_path_factory.mktemp("small"), Spec(family="qwen3_5"))


@pytest.fixture(scope="module")
def sharded_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NVIDIA-style NVFP4 Qwen3.5 MoE (the mtp.fc gap), two shards + index."""
    return write_checkpoint(
        tmp_path_factory.mktemp("sharded"), Spec(family="qwen3_5_moe", quant="nvfp4", shards=2)
    )


@pytest.fixture(scope="module")
def variant_dir(tmp_path_factory: pytest.TempPathFactory, small_src: Path) -> Path:
    """A real -mtpfp8 variant of ``small_src``."""
    dst = tmp_path_factory.mktemp("variant") / "small-mtpfp8"
    quantize_mtp(str(small_src), dst, device="cpu")
    return dst


@pytest.fixture(scope="module")
def vocab_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory with a real tokenizer (what build-draft-vocab reads)."""
    d = tmp_path_factory.mktemp("vocab_src")
    write_tiny_tokenizer(d, vocab_size=300)
    (d / "config.json").write_text(json.dumps({"vocab_size": 320, "eos_token_id": 2}))
    return d


# --------------------------------------------------------------------------- the cases
DEEP = "[" * 100_000 + "]" * 100_000  # deeper than Python's JSON decoder can recurse

# Each builder gets (world, fixtures) and returns the command and what its Error names.

Builder = Callable[[Path, "Fixtures"], Case]
CASES: dict[str, Builder] = {}


def case(name: str) -> Callable[[Builder], Builder]:
    def register(fn: Builder) -> Builder:
        assert name not in CASES
        CASES[name] = fn
        return fn

    return register


@dataclass
class Fixtures:
    small: Path
    sharded: Path
    variant: Path
    vocab: Path


def _copy(src: Path, world: Path, name: str = "src") -> Path:
    dst = world / name
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _q(src: Path, world: Path) -> list[str]:
    return ["quantize-mtp", str(src), str(world / "out" / "v")]


# --- safetensors headers --------------------------------------------------------------


@case("inspect-header-length-past-eof")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    p = src / "model.safetensors"
    raw = p.read_bytes()
    p.write_bytes(struct.pack("<Q", len(raw) * 4) + raw[8:])
    return Case(["inspect", str(src)], ["model.safetensors", "header", "truncated"])


@case("inspect-header-length-huge")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    p = src / "model.safetensors"
    raw = p.read_bytes()
    p.write_bytes(struct.pack("<Q", 2**64 - 1) + raw[8:])
    return Case(["inspect", str(src)], ["model.safetensors", "header"])


@case("inspect-header-not-json")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    p = src / "model.safetensors"
    raw = bytearray(p.read_bytes())
    raw[8:24] = b"\xff" * 16
    p.write_bytes(bytes(raw))
    return Case(["inspect", str(src)], ["model.safetensors", "not valid JSON"])


@case("inspect-truncated-data")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    p = src / "model.safetensors"
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) // 2])
    return Case(["inspect", str(src)], ["model.safetensors", "truncated"])


@case("inspect-too-short")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    (src / "model.safetensors").write_bytes(b"\x01\x02\x03")
    return Case(["inspect", str(src)], ["model.safetensors", "too short"])


@case("inspect-overlapping-tensors")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)

    def overlap(h: dict) -> None:
        a, b = "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.post_attention_layernorm.weight"
        h[b]["data_offsets"] = list(h[a]["data_offsets"])

    _rewrite_header(src / "model.safetensors", overlap)
    return Case(["inspect", str(src)], ["model.safetensors", "overlap", "layernorm"])


@case("quantize-dtype-vs-offsets")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)

    def lie(h: dict) -> None:
        h["mtp.fc.weight"]["dtype"] = "F32"

    _rewrite_header(src / "model.safetensors", lie)
    return Case(_q(src, w), ["model.safetensors", "mtp.fc.weight", "needs"])


@case("quantize-shape-vs-offsets")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)

    def lie(h: dict) -> None:
        h["mtp.fc.weight"]["shape"] = [64, 64]

    _rewrite_header(src / "model.safetensors", lie)
    return Case(_q(src, w), ["model.safetensors", "mtp.fc.weight", "needs"])


@case("quantize-duplicate-header-key")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    p = src / "model.safetensors"
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = raw[8 : 8 + n].rstrip()
    entry = json.dumps({"dtype": "BF16", "shape": [64], "data_offsets": [0, 128]})
    new = header[:-1] + f',"mtp.norm.weight":{entry}}}'.encode()
    new += b" " * (-len(new) % 8)
    p.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])
    return Case(_q(src, w), ["model.safetensors", "mtp.norm.weight"])


# --- the index ------------------------------------------------------------------------


@case("inspect-index-missing-shard")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    (src / SHARD1).unlink()
    return Case(["inspect", str(src)], [INDEX, SHARD1, "missing"])


@case("quantize-index-wrong-shard")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    doc = _index(src)
    doc["weight_map"]["mtp.fc.weight"] = SHARD1
    _write_index(src, doc)
    return Case(_q(src, w), [INDEX, "mtp.fc.weight", SHARD1])


@case("quantize-index-omits-a-stored-tensor")
def _(w: Path, f: Fixtures) -> Case:
    # The shard holding the drafter is rewritten from the index: an unlisted target tensor
    # in it would silently vanish from the variant.
    src = _copy(f.sharded, w)
    doc = _index(src)
    victim = next(k for k, v in doc["weight_map"].items() if v == SHARD2 and not k.startswith("mtp."))
    del doc["weight_map"][victim]
    _write_index(src, doc)
    return Case(_q(src, w), [INDEX, SHARD2, victim, "does not list"])


@case("quantize-index-duplicate-entry")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    text = (src / INDEX).read_text()
    text = text.replace('"weight_map": {', f'"weight_map": {{\n    "mtp.fc.weight": "{SHARD2}",', 1)
    _write_index(src, text)
    return Case(_q(src, w), [INDEX, "mtp.fc.weight", "twice"])


@case("quantize-index-escaping-path")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    shutil.copy(src / SHARD2, w / SHARD2)
    doc = _index(src)
    doc["weight_map"] = {k: (f"../{SHARD2}" if v == SHARD2 else v) for k, v in doc["weight_map"].items()}
    _write_index(src, doc)
    return Case(_q(src, w), [INDEX, f"../{SHARD2}", "outside"])


@case("quantize-index-aliased-shard-path")
def _(w: Path, f: Fixtures) -> Case:
    # "./shard" names the same file as "shard": one would be hard-linked, the other
    # rewritten in place through the link, truncating the source's shard.
    src = _copy(f.sharded, w)
    doc = _index(src)
    doc["weight_map"] = {
        k: (f"./{v}" if v == SHARD2 and not k.startswith("mtp.") else v) for k, v in doc["weight_map"].items()
    }
    _write_index(src, doc)
    return Case(_q(src, w), [INDEX, f"./{SHARD2}", "plain relative path"])


@case("inspect-index-shard-name-too-long")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    doc = _index(src)
    doc["weight_map"]["mtp.fc.weight"] = "s" * 300 + ".safetensors"
    _write_index(src, doc)
    return Case(["inspect", str(src)], [INDEX, "sss", "cannot be opened"])


@case("inspect-index-absolute-path")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    doc = _index(src)
    doc["weight_map"]["mtp.fc.weight"] = str(src / SHARD2)
    _write_index(src, doc)
    return Case(["inspect", str(src)], [INDEX, "outside"])


@case("inspect-index-not-an-index")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    _write_index(src, [SHARD1, SHARD2])
    return Case(["inspect", str(src)], [INDEX, "weight_map"])


@case("quantize-index-not-json")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    _write_index(src, "{ this is not json")
    return Case(_q(src, w), [INDEX, "not valid JSON"])


@case("quantize-index-names-a-directory")
def _(w: Path, f: Fixtures) -> Case:
    # "Unreadable" without permissions (tests may run as root): a directory where a shard is expected.
    src = _copy(f.sharded, w)
    (src / SHARD1).unlink()
    (src / SHARD1).mkdir()
    return Case(_q(src, w), [INDEX, SHARD1, "not a regular file"])


@case("quantize-index-names-a-fifo")
def _(w: Path, f: Fixtures) -> Case:
    # A FIFO where a shard is expected: opening it would block forever; it must be refused.
    src = _copy(f.sharded, w)
    (src / SHARD1).unlink()
    os.mkfifo(src / SHARD1)
    return Case(_q(src, w), [INDEX, SHARD1, "not a regular file"])


@case("quantize-fifo-among-other-files")
def _(w: Path, f: Fixtures) -> Case:
    # Hashing the source's files would open the FIFO and block forever.
    src = _copy(f.small, w)
    os.mkfifo(src / "notes.txt")
    return Case(_q(src, w), ["notes.txt", "not a regular file"])


@case("fix-exclusions-broken-link-among-other-files")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    (src / "README.md").symlink_to(w / "nowhere.md")
    return Case(["fix-exclusions", str(src), str(w / "out" / "fixed")], ["README.md", "not a regular file"])


@case("inspect-symlinked-shard-outside")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    outside = w / "elsewhere"
    outside.mkdir()
    shutil.move(str(src / SHARD1), outside / SHARD1)
    (src / SHARD1).symlink_to(outside / SHARD1)
    return Case(["inspect", str(src)], [SHARD1, "outside the checkpoint"])


@case("quantize-symlinked-single-file-outside")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    outside = w / "elsewhere"
    outside.mkdir()
    shutil.move(str(src / "model.safetensors"), outside / "model.safetensors")
    (src / "model.safetensors").symlink_to(outside / "model.safetensors")
    return Case(_q(src, w), ["model.safetensors", "outside the checkpoint"])


@case("quantize-shard-symlink-to-itself")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    (src / SHARD1).unlink()
    (src / SHARD1).symlink_to(SHARD1)
    return Case(_q(src, w), [SHARD1, "symlink loop"])


@case("inspect-single-file-two-link-cycle")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    (src / "model.safetensors").unlink()
    (src / "model.safetensors").symlink_to("other.safetensors")
    (src / "other.safetensors").symlink_to("model.safetensors")
    return Case(["inspect", str(src)], ["symlink loop", ".safetensors"])


# --- configs --------------------------------------------------------------------------


@case("inspect-config-nested-too-deeply")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    (src / "config.json").write_text('{"model_type": ' + DEEP + "}")
    return Case(["inspect", str(src)], ["config.json", "nested too deeply"])


@case("inspect-config-not-json")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    (src / "config.json").write_text('{"model_type": "qwen3_5",')
    return Case(["inspect", str(src)], ["config.json", "not valid JSON"])


@case("quantize-config-not-an-object")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    (src / "config.json").write_text("[1, 2, 3]")
    return Case(_q(src, w), ["config.json", "object"])


@case("quantize-config-binary")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    (src / "config.json").write_bytes(b"\xff\xfe\x00\x01garbage")
    return Case(_q(src, w), ["config.json"])


@case("quantize-config-missing")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    (src / "config.json").unlink()
    return Case(_q(src, w), ["config.json", "missing"])


@case("quantize-config-is-a-directory")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    (src / "config.json").unlink()
    (src / "config.json").mkdir()
    return Case(_q(src, w), ["config.json"])


@case("quantize-draft-vocab-config-without-vocab-size")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["vocab_size"]
    (src / "config.json").write_text(json.dumps(cfg))
    ids = w / "ids.pt"
    torch.save(torch.arange(8, dtype=torch.int64), ids)
    return Case([*_q(src, w), "--draft-vocab", str(ids)], ["vocab_size"])


@case("quantize-hf-quant-config-not-json")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    (src / "hf_quant_config.json").write_text("quantization: NVFP4")
    return Case(_q(src, w), ["hf_quant_config.json", "not valid JSON"])


@case("quantize-mixed-precision-without-quantized-layers")
def _(w: Path, f: Fixtures) -> Case:
    """vLLM refuses such a config ("MIXED_PRECISION quant_algo requires a non-empty
    'quantized_layers' mapping"): no variant is written from it."""
    src = _copy(f.sharded, w)
    for name, key in (("hf_quant_config.json", "quantization"), ("config.json", "quantization_config")):
        doc = json.loads((src / name).read_text())
        doc[key]["quant_algo"] = "MIXED_PRECISION"
        doc[key]["quantized_layers"] = {}
        (src / name).write_text(json.dumps(doc))
    return Case(_q(src, w), ["quantized_layers", "empty", "MIXED_PRECISION", "vLLM refuses"])


@case("fix-exclusions-hf-quant-config-missing-quantization")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    (src / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}}))
    return Case(
        ["fix-exclusions", str(src), str(w / "out" / "fixed")], ["hf_quant_config.json", "quantization"]
    )


@case("fix-exclusions-config-exclude-not-a-list")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = "lm_head"
    (src / "config.json").write_text(json.dumps(cfg))
    return Case(["fix-exclusions", str(src), str(w / "out" / "fixed")], ["config.json", "ignore"])


@case("fix-exclusions-in-place-config-not-json")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    (src / "config.json").write_text("{")
    return Case(["fix-exclusions", str(src), "--in-place"], ["config.json", "not valid JSON"])


@case("fix-exclusions-destination-inside-source")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    return Case(["fix-exclusions", str(src), str(src / "fixed")], ["inside the source"])


@case("fix-exclusions-truncated-shard")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.sharded, w)
    p = src / SHARD2
    p.write_bytes(p.read_bytes()[:-100])
    return Case(["fix-exclusions", str(src), str(w / "out" / "fixed")], [SHARD2, "truncated"])


# --- weights and layout ---------------------------------------------------------------


@case("quantize-nan-drafter-weight")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    _poison(src, "mtp.layers.0.mlp.down_proj.weight", float("nan"))
    return Case(_q(src, w), ["mtp.layers.0.mlp.down_proj.weight", "NaN"])


@case("quantize-inf-drafter-weight")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    _poison(src, "mtp.fc.weight", float("-inf"))
    return Case(_q(src, w), ["mtp.fc.weight", "Inf"])


@case("quantize-no-mtp-block")
def _(w: Path, f: Fixtures) -> Case:
    src = write_checkpoint(w / "src", Spec(family="qwen3_5", write_mtp=False))
    return Case(_q(src, w), ["no MTP drafter", "inspect"])


@case("quantize-variant-as-source")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.variant, w)
    return Case(_q(src, w), ["already an -mtpfp8 variant"])


@case("quantize-fp8-drafter-without-manifest")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.variant, w)
    (src / "mtpconv.json").unlink()
    return Case(_q(src, w), ["FP8", "mtp."])


@case("quantize-destination-inside-source")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    return Case(["quantize-mtp", str(src), str(src / "v")], ["inside the source"])


@case("quantize-destination-is-source")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    return Case(["quantize-mtp", str(src), str(src)], ["inside the source"])


@case("quantize-destination-exists")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    (w / "out" / "v").mkdir(parents=True)
    (w / "out" / "v" / "keep.txt").write_text("mine")
    return Case(_q(src, w), ["already exists", "--force"])


@case("quantize-destination-parent-is-a-file")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    (w / "afile").write_text("a file, not a directory")
    return Case(["quantize-mtp", str(src), str(w / "afile" / "v")], ["afile"])


@case("inspect-empty-directory")
def _(w: Path, f: Fixtures) -> Case:
    (w / "src").mkdir()
    return Case(["inspect", str(w / "src")], ["no safetensors weights"])


@case("quantize-source-is-a-file")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    return Case(_q(src / "model.safetensors", w), ["model.safetensors", "directory"])


@case("quantize-draft-vocab-pickle")
def _(w: Path, f: Fixtures) -> Case:
    import pickle

    src = _copy(f.small, w)
    ids = w / "ids.pt"
    ids.write_bytes(pickle.dumps({"ids": [1, 2, 3]}))
    return Case([*_q(src, w), "--draft-vocab", str(ids)], ["ids.pt"])


@case("quantize-draft-vocab-out-of-range")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    ids = w / "ids.pt"
    torch.save(torch.tensor([1, 5, 100000], dtype=torch.int64), ids)
    return Case([*_q(src, w), "--draft-vocab", str(ids)], ["ids.pt", "100000"])


# --- build-draft-vocab ----------------------------------------------------------------


def _vocab_args(src: Path, w: Path, corpus: Path) -> list[str]:
    return [
        "build-draft-vocab",
        str(src),
        "--corpus",
        str(corpus),
        "--size",
        "16",
        "--output",
        str(w / "out" / "ids.pt"),
    ]


@case("vocab-empty-corpus")
def _(w: Path, f: Fixtures) -> Case:
    corpus = w / "empty.txt"
    corpus.write_text("")
    return Case(_vocab_args(f.vocab, w, corpus), ["empty.txt", "no text"])


@case("vocab-binary-corpus")
def _(w: Path, f: Fixtures) -> Case:
    corpus = w / "blob.txt"
    corpus.write_bytes(bytes(range(256)) * 8)
    return Case(_vocab_args(f.vocab, w, corpus), ["blob.txt", "binary"])


@case("vocab-corpus-bad-gzip")
def _(w: Path, f: Fixtures) -> Case:
    corpus = w / "c.jsonl.gz"
    corpus.write_bytes(b"this is not gzip at all\n")
    return Case(_vocab_args(f.vocab, w, corpus), ["c.jsonl.gz", "gzip"])


@case("vocab-corpus-jsonl-not-json")
def _(w: Path, f: Fixtures) -> Case:
    corpus = w / "c.jsonl"
    corpus.write_text('{"text": "fine"}\n{"text": broken\n')
    return Case(_vocab_args(f.vocab, w, corpus), ["c.jsonl", "line 2"])


@case("vocab-corpus-jsonl-nested-too-deeply")
def _(w: Path, f: Fixtures) -> Case:
    corpus = w / "deep.jsonl"
    corpus.write_text('{"text": "fine"}\n' + DEEP + "\n")
    return Case(_vocab_args(f.vocab, w, corpus), ["deep.jsonl", "line 2", "nested too deeply"])


@case("vocab-generation-config-nested-too-deeply")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.vocab, w)
    (src / "generation_config.json").write_text(DEEP)
    corpus = w / "c.txt"
    corpus.write_text("some words here\n")
    return Case(_vocab_args(src, w, corpus), ["generation_config.json"])


@case("vocab-corpus-is-a-fifo")
def _(w: Path, f: Fixtures) -> Case:
    corpus = w / "pipe.txt"
    os.mkfifo(corpus)
    return Case(_vocab_args(f.vocab, w, corpus), ["pipe.txt"])


@case("vocab-tokenizer-not-a-tokenizer")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.vocab, w)
    (src / "tokenizer.json").write_text(json.dumps({"model": {"type": "nonsense"}, "hello": 1}))
    corpus = w / "c.txt"
    corpus.write_text("some words here\n")
    return Case(_vocab_args(src, w, corpus), ["tokenizer.json", "not a valid tokenizers file"])


@case("vocab-tokenizer-binary")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.vocab, w)
    (src / "tokenizer.json").write_bytes(os.urandom(512))
    corpus = w / "c.txt"
    corpus.write_text("some words here\n")
    return Case(_vocab_args(src, w, corpus), ["tokenizer.json"])


@case("vocab-tokenizer-is-a-directory")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.vocab, w)
    (src / "tokenizer.json").unlink()
    (src / "tokenizer.json").mkdir()
    corpus = w / "c.txt"
    corpus.write_text("some words here\n")
    return Case(_vocab_args(src, w, corpus), ["tokenizer.json"])


@case("vocab-config-not-json")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.vocab, w)
    (src / "config.json").write_text("{nope")
    corpus = w / "c.txt"
    corpus.write_text("some words here\n")
    return Case(_vocab_args(src, w, corpus), ["config.json"])


@case("vocab-config-without-vocab-size")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.vocab, w)
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    corpus = w / "c.txt"
    corpus.write_text("some words here\n")
    return Case(_vocab_args(src, w, corpus), ["config.json", "vocab_size"])


# --- publish (dry runs only: nothing is ever contacted) ------------------------------


@case("publish-not-a-variant")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.small, w)
    return Case(["publish", str(src), "--dry-run"], ["mtpconv.json", "not an mtpconv variant"])


@case("publish-manifest-not-json")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.variant, w)
    (src / "mtpconv.json").write_text("{ broken")
    return Case(["publish", str(src), "--dry-run"], ["mtpconv.json"])


@case("publish-manifest-wrong-shape")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.variant, w)
    doc = json.loads((src / "mtpconv.json").read_text())
    doc["drafter"] = ["mtp.fc"]
    (src / "mtpconv.json").write_text(json.dumps(doc))
    return Case(["publish", str(src), "--dry-run"], ["mtpconv.json", "malformed"])


@case("publish-tampered-shard")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.variant, w)
    p = src / "model.safetensors"
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0xFF
    p.write_bytes(bytes(raw))
    return Case(["publish", str(src), "--dry-run"], ["model.safetensors", "sha256"])


@case("publish-missing-file")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.variant, w)
    (src / "generation_config.json").unlink()
    return Case(["publish", str(src), "--dry-run"], ["generation_config.json", "missing"])


@case("publish-manifest-escaping-path")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.variant, w)
    doc = json.loads((src / "mtpconv.json").read_text())
    doc["files"]["../secret"] = "0" * 64
    (src / "mtpconv.json").write_text(json.dumps(doc))
    return Case(["publish", str(src), "--dry-run"], ["mtpconv.json", "../secret"])


@case("publish-listed-file-is-a-directory")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.variant, w)
    (src / "generation_config.json").unlink()
    (src / "generation_config.json").mkdir()
    return Case(["publish", str(src), "--dry-run"], ["generation_config.json"])


@case("publish-unlisted-extra-file")
def _(w: Path, f: Fixtures) -> Case:
    src = _copy(f.variant, w)
    (src / "notes.txt").write_text("added after conversion")
    return Case(["publish", str(src), "--dry-run"], ["notes.txt", "not listed"])


@case("publish-not-a-directory")
def _(w: Path, f: Fixtures) -> Case:
    return Case(["publish", str(w / "nowhere"), "--dry-run"], ["nowhere", "not a directory"])


# --------------------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def fixtures(small_src: Path, sharded_src: Path, variant_dir: Path, vocab_src: Path) -> Fixtures:
    return Fixtures(small_src, sharded_src, variant_dir, vocab_src)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input(name: str, fixtures: Fixtures, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    world = tmp_path / "world"
    world.mkdir()
    (world / "out").mkdir()
    c = CASES[name](world, fixtures)
    shared_before = {p: snapshot(p) for p in (fixtures.small, fixtures.sharded, fixtures.variant)}
    before = snapshot(world)

    code, out, err = run_cli(c.args, capsys)

    assert "Traceback" not in err and "Traceback" not in out, err
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert code == 1, f"exit {code}; stderr:\n{err}"
    assert len(errors) == 1, err
    for needle in c.names:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    assert snapshot(world) == before, "the command changed or left files behind"
    assert {p: snapshot(p) for p in shared_before} == shared_before


def test_matrix_covers_every_command() -> None:
    commands = {name.split("-")[0] for name in CASES}
    assert commands == {"inspect", "quantize", "vocab", "fix", "publish"}
    assert len(CASES) >= 25


@pytest.mark.skipif(
    os.geteuid() == 0,
    reason="root reads any file whatever its mode; unreadability is covered by the directory and FIFO cases",
)
def test_unreadable_shard_by_permissions(
    sharded_src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _copy(sharded_src, tmp_path)
    (src / SHARD1).chmod(0)
    try:
        code, _, err = run_cli(["quantize-mtp", str(src), str(tmp_path / "v")], capsys)
    finally:
        (src / SHARD1).chmod(0o644)
    assert code == 1 and SHARD1 in err and "Traceback" not in err
    assert not (tmp_path / "v").exists()


def test_source_ids_file_is_not_written_through(small_src: Path, tmp_path: Path) -> None:
    """A source that ships its own mtp_draft_vocab_ids.pt keeps it byte for byte: the
    variant's ids file replaces the hard link instead of writing through it."""
    from mtpconv.manifest import read_manifest
    from mtpconv.variant_check import bad_files

    src = _copy(small_src, tmp_path)
    torch.save(torch.arange(10, dtype=torch.int64), src / "mtp_draft_vocab_ids.pt")
    ids = tmp_path / "ids.pt"
    torch.save(torch.arange(0, 40, 2, dtype=torch.int64), ids)
    before = snapshot(src)
    quantize_mtp(str(src), tmp_path / "v", draft_vocab=ids, device="cpu")
    assert snapshot(src) == before
    assert torch.equal(
        torch.load(tmp_path / "v" / "mtp_draft_vocab_ids.pt", weights_only=True), torch.arange(0, 40, 2)
    )
    manifest = read_manifest(tmp_path / "v")
    assert manifest is not None and bad_files(tmp_path / "v", manifest) == []


def test_output_files_are_always_new(tmp_path: Path) -> None:
    """The writer refuses to open an existing file (which could be a hard link into the source)."""
    from mtpconv.checkpoint.writer import HashingWriter
    from mtpconv.errors import OutputError

    target = tmp_path / "linked.safetensors"
    original = tmp_path / "source.safetensors"
    original.write_bytes(b"source bytes")
    os.link(original, target)
    with pytest.raises(OutputError, match="linked.safetensors"):
        HashingWriter(target)
    assert original.read_bytes() == b"source bytes"


def test_force_over_a_file_leaves_no_stray_temp(small_src: Path, tmp_path: Path) -> None:
    """--force replaces a destination that is a plain file without leaving the old one
    behind as a hidden temp entry."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "v").write_text("not a variant")
    quantize_mtp(str(small_src), out / "v", device="cpu", force=True)
    assert sorted(p.name for p in out.iterdir()) == ["v"]
    assert (out / "v" / "mtpconv.json").is_file()


@pytest.mark.parametrize(
    ("command", "edit"),
    [
        ("publish", lambda d: d["quantization_error"].update({"mtp.fc": {"rel_l2": "x"}})),
        (
            "inspect",
            lambda d: d.update(
                draft_vocab={"size": 1, "file": "f", "sha256": "0", "head_tensor": 1, "head_dtype": "fp8"}
            ),
        ),
    ],
    ids=["publish-quantization-error-not-a-number", "inspect-draft-head-not-a-string"],
)
def test_hand_edited_manifest_types(
    command: str,
    edit: Callable[[dict], None],
    variant_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = _copy(variant_dir, tmp_path)
    doc = json.loads((src / "mtpconv.json").read_text())
    edit(doc)
    (src / "mtpconv.json").write_text(json.dumps(doc))
    args = ["publish", str(src), "--dry-run"] if command == "publish" else ["inspect", str(src)]
    code, _, err = run_cli(args, capsys)
    assert code == 1 and "mtpconv.json" in err
