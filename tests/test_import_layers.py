"""The dependency rule of docs/architecture.md: adapters → core → store, never back.

* ``store/`` imports no deep-learning framework and nothing of ``msprobe``;
* ``msprobe/core/`` imports no deep-learning framework and neither adapter
  (``msprobe.pytorch``, ``msprobe.mindspore``).

Every ``import``/``from ... import`` statement of each file is checked, those inside
functions (lazy imports) included, so an import that runs only on some path is caught too.
A second test imports every module of both packages in a fresh interpreter and checks that
neither framework got loaded.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("torch", "mindspore")
ADAPTERS = ("msprobe.pytorch", "msprobe.mindspore")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in the file at ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(package_dir: Path, forbidden: tuple[str, ...]) -> list[str]:
    """``file:line module`` of each import in ``package_dir`` of a module under ``forbidden``."""
    return [f"{path.relative_to(ROOT)}:{line} {module}"
            for path in sorted(package_dir.rglob("*.py"))
            for line, module in imported_modules(path) if _under(module, forbidden)]


def test_scanner_sees_imports_inside_functions():
    # the adapters do import their framework, some of it lazily: the scanner must see both
    found = violations(ROOT / "msprobe" / "pytorch", ("torch",))
    assert any(v.startswith("msprobe/pytorch/debugger.py:") for v in found)
    tree = ast.parse("def f():\n    import torch.nn\n")
    assert [(n.lineno, n.names[0].name) for n in ast.walk(tree) if isinstance(n, ast.Import)] == [(2, "torch.nn")]


def test_store_imports_no_framework_and_no_msprobe():
    assert violations(ROOT / "store", FRAMEWORKS + ("msprobe",)) == []


def test_core_imports_no_framework_and_no_adapter():
    assert violations(ROOT / "msprobe" / "core", FRAMEWORKS + ADAPTERS) == []


@pytest.mark.parametrize("package", ["store", "msprobe/core"])
def test_importing_every_module_loads_no_framework(package):
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                     for p in (ROOT / package).rglob("*.py"))
    assert len(modules) > 10
    script = ("import importlib, sys\n"
              f"for m in {modules!r}:\n    importlib.import_module(m)\n"
              f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
