"""inspect on every layout: family, drafter tensors, formats, findings; tables and JSON."""

from __future__ import annotations

import json
import struct
import time
import tracemalloc
from pathlib import Path

import pytest

from fixtures.checkpoints import FAMILIES, Spec, write_checkpoint
from mtpconv.commands.inspect import inspect_checkpoint
from tests.helpers import run_cli

EXPECTED_DRAFTER_START = {
    "qwen3_5": "mtp.",
    "qwen3_5_moe": "mtp.",
    "qwen3_next": "mtp.",
    "qwen4exp": "mtp.",
    "deepseek_v3": "model.layers.2.",
    "glm4_moe": "model.layers.2.",
    "mimo": "model.mtp_layers.",
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("quant", ["bf16", "nvfp4"])
def test_every_layout(tmp_path: Path, family: str, quant: str, capsys: pytest.CaptureFixture[str]) -> None:
    shards = 3 if quant == "nvfp4" else 1
    vlm = family.startswith("qwen3_5") and quant == "nvfp4"
    write_checkpoint(tmp_path, Spec(family=family, quant=quant, shards=shards, vlm=vlm))
    code, out, err = run_cli(["inspect", str(tmp_path), "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["family"] == family
    assert doc["mtp_layers"] == {"declared": 1, "found": 1}
    names = [t["name"] for t in doc["drafter_tensors"]]
    assert names and all(n.startswith(EXPECTED_DRAFTER_START[family]) for n in names)
    linears = [t for t in doc["drafter_tensors"] if t["role"] == "linear"]
    assert linears and all(t["format"] == "plain" for t in linears)
    assert all(t["role"] == "norm" for t in doc["drafter_tensors"] if "norm" in t["name"].rsplit(".", 2)[-2])
    cost = doc["draft_bytes_per_step"]
    assert cost["total_fp8"] < cost["total_now"] and cost["total_fp8_truncated"] <= cost["total_fp8"]
    codes = {f["code"] for f in doc["findings"]}
    if quant == "nvfp4":
        assert doc["quant"]["algo"] == "NVFP4"
        if family in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):
            gap = [f for f in doc["findings"] if f["code"] == "plain-declared-quantized"]
            assert [f["module"] for f in gap] == ["mtp.fc"] and gap[0]["severity"] == "error"
    else:
        assert doc["quant"]["method"] == "none" and not codes
    # the same report as tables
    code, out, _ = run_cli(["inspect", str(tmp_path)], capsys)
    assert code == 0 and family in out and "Drafter tensors" in out


def test_nvfp4_drafter_formats(tmp_path: Path) -> None:
    write_checkpoint(
        tmp_path, Spec(family="qwen3_next", quant="nvfp4", drafter_quant="nvfp4", exclude=["lm_head"])
    )
    r = inspect_checkpoint(str(tmp_path))
    rows = {row.name: row for row in r.drafter}
    assert rows["mtp.fc.weight"].format == "nvfp4" and rows["mtp.fc.weight"].declared == "NVFP4"
    assert rows["mtp.fc.weight_scale"].format == "scale"
    assert not [f for f in r.findings if f.severity.value == "error"]


def test_declared_but_missing_and_undeclared(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "a", Spec(family="qwen3_5", write_mtp=False))
    r = inspect_checkpoint(str(tmp_path / "a"))
    assert [f.code for f in r.findings] == ["mtp-declared-missing"]
    write_checkpoint(tmp_path / "b", Spec(family="qwen3_5", declare_mtp=False))
    r = inspect_checkpoint(str(tmp_path / "b"))
    assert "mtp-undeclared" in [f.code for f in r.findings]


def test_quantized_but_excluded(tmp_path: Path) -> None:
    write_checkpoint(
        tmp_path, Spec(family="qwen3_5", quant="nvfp4", exclude=["lm_head", "model.layers.0*", "mtp*"])
    )
    r = inspect_checkpoint(str(tmp_path))
    bad = [f for f in r.findings if f.code == "quantized-declared-plain"]
    assert bad and all(f.module.startswith("model.layers.0.") for f in bad)


def test_inspect_reads_headers_only(tmp_path: Path) -> None:
    """A 64 GiB tensor whose data is a hole in a sparse file inspects instantly."""
    write_checkpoint(tmp_path, Spec(family="qwen3_5"))
    big = 64 << 30
    header = json.dumps(
        {
            "model.layers.9.mlp.huge.weight": {
                "dtype": "BF16",
                "shape": [big // 2 // 65536, 65536],
                "data_offsets": [0, big],
            }
        }
    ).encode()
    path = tmp_path / "model-huge.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + big)
    assert path.stat().st_blocks * 512 < 1 << 20  # really sparse
    tracemalloc.start()
    t0 = time.perf_counter()
    r = inspect_checkpoint(str(tmp_path))
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert r.total_bytes > big
    assert elapsed < 1.0
    assert peak < 50 << 20


def test_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["inspect", str(tmp_path / "nope")], capsys)
    assert code == 1 and out == ""
    assert err.startswith("Error:") and err.count("\n") == 1
    (tmp_path / "d").mkdir()
    code, _, err = run_cli(["inspect", str(tmp_path / "d")], capsys)
    assert code == 1 and "no safetensors" in err


def test_bad_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoint(tmp_path, Spec(family="qwen3_5"))
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = run_cli(["inspect", str(tmp_path)], capsys)
    assert code == 1 and "config.json" in err and "Traceback" not in err


def test_usage_error_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run_cli(["inspect"], capsys)
    assert code == 2


def test_variant_finding_says_how_stock_vllm_reads_the_drafter(tmp_path: Path) -> None:
    from mtpconv.commands.quantize_mtp import quantize_mtp

    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5", quant="nvfp4"))
    quantize_mtp(str(src), tmp_path / "dst")
    finding = next(
        f for f in inspect_checkpoint(str(tmp_path / "dst")).findings if f.code == "mtpconv-fp8-drafter"
    )
    assert "FP8_PER_CHANNEL_PER_TOKEN" in finding.message
    assert "stock vLLM loads them with its own FP8 methods" in finding.message
    # vLLM 0.26-0.29's mixed config builds no FP8_PER_CHANNEL_PER_TOKEN layer (0.26 refused at load).
    assert "stock vLLM older than 0.30 refuses them at load" in finding.message
