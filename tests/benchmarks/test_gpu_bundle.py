"""The vLLM bundle for the device (benchmarks/gpu_e2e/bundle.py), checked where it can be here:
which requirements are resolved, which resolved packages travel, and the parts' sizes."""

from __future__ import annotations

from pathlib import Path

from benchmarks.gpu_e2e import bundle


def test_requirements_leave_out_extras_and_what_the_runs_never_load() -> None:
    lines = [
        "torch==2.11.0",
        "xgrammar==0.2.9; platform_machine == 'x86_64'",
        "flashinfer-python==0.6.14",
        "torchvision==0.26.0",
        "nvidia-cutlass-dsl>=4",
        "pytest; extra == 'test'",
        "Mistral_Common[image]>=1.8",
        "regex",
    ]
    assert bundle.requirements_to_resolve(lines) == [
        "torch==2.11.0",
        "xgrammar==0.2.9; platform_machine == 'x86_64'",
        "regex",
    ]


def test_the_pinned_resolution_ships_what_the_device_lacks() -> None:
    resolved = bundle.RESOLVED.read_text().splitlines()
    shipped = {bundle._name(line) for line in bundle.to_ship(resolved)}
    names = {bundle._name(line) for line in resolved}
    # The device's own torch, triton and transformers stay; the engine's own needs travel.
    assert {"torch", "triton", "transformers", "numpy", "huggingface-hub"} <= names - shipped
    assert not any(n.startswith(("nvidia-", "cuda-")) for n in shipped)
    # xgrammar imports apache-tvm-ffi at vLLM's start-up and the device's image lacks it
    # (the first device run of the shared recipe died there: "No module named 'tvm_ffi'").
    assert {"xgrammar", "apache-tvm-ffi", "msgspec", "compressed-tensors"} <= shipped
    assert not shipped & bundle.NOT_NEEDED
    assert all("==" in line for line in bundle.to_ship(resolved))


def test_a_part_and_the_working_tree_fit_one_device_call(tmp_path: Path) -> None:
    assert bundle.PART_MIB + 8 <= bundle.CALL_LIMIT_MIB  # the tree (about 3 MiB) and the zstandard wheel
    data = bytes(range(256)) * 41  # 10,496 bytes
    src = tmp_path / "bundle.tar"
    src.write_bytes(data)
    out = tmp_path / "parts"
    out.mkdir()
    parts = bundle.split(src, out, 4096)
    assert [p.name for p in parts] == ["p00", "p01", "p02"]
    assert [p.stat().st_size for p in parts] == [4096, 4096, 2304]
    assert b"".join(p.read_bytes() for p in parts) == data
