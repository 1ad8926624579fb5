"""Every module of the package is reached from what the product runs: the CLI (``mtpconv.cli``,
``mtpconv.__main__``) and the vLLM plugin (``mtpconv.vllm_plugin``). The walk is static: every
``import`` statement of a reached module counts, lazy ones inside functions included, and so do
``"package.module:attr"`` strings (how the plugin names its drafter classes to vLLM) and strings that
are exactly a module's name (``python -m mtpconv.evaluation.worker``: how eval starts a row)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTS = ("mtpconv.cli", "mtpconv.__main__", "mtpconv.vllm_plugin")
# Modules outside mtpconv/kernels that nothing the product runs imports (found by this walk):
# none today; a module added here needs a reason.
EXPECTED_ORPHANS: set[str] = set()


def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}  # a submodule, where it is one
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= set(re.findall(r"\b(mtpconv(?:\.\w+)+):\w+", node.value))
            if re.fullmatch(r"mtpconv(?:\.\w+)+", node.value):
                found.add(node.value)
    return {m for m in found if m.startswith("mtpconv")}


def reachable() -> set[str]:
    seen: set[str] = set()
    todo = list(STARTS)
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a module imports its packages
            mod = ".".join(parts[:i])
            path = _module_file(mod)
            if path is None or mod in seen:
                continue
            seen.add(mod)
            todo.extend(_imports(mod, path))
    return seen


def every_module() -> set[str]:
    out = set()
    for path in (ROOT / "mtpconv").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out.add(".".join(parts))
    return out


def test_every_kernel_module_is_reached_from_the_cli_or_the_plugin() -> None:
    kernels = {m for m in every_module() if m.startswith("mtpconv.kernels")}
    assert kernels, "no kernel modules found"
    assert sorted(kernels - reachable()) == []


def test_every_module_of_the_package_is_reached() -> None:
    orphans = every_module() - reachable()
    assert orphans == EXPECTED_ORPHANS, sorted(orphans ^ EXPECTED_ORPHANS)


def test_the_wheel_ships_the_product_alone(tmp_path: Path) -> None:
    """Tiny-model builders, the vLLM stubs and their sitecustomize.py stay in the repository."""
    import subprocess
    import sys
    import zipfile

    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("mtpconv-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mtpconv/cli/app.py" in names and "mtpconv/kernels/tuned/NVIDIA_H200.json" in names
    leaked = [
        n
        for n in names
        if n.startswith(("fixtures/", "tests/", "benchmarks/", "scripts/", "mtpconv/testing/"))
    ]
    assert leaked == []
    assert not [n for n in names if n.endswith("sitecustomize.py") or "vllm_stub" in n or "planted" in n]
