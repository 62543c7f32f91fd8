"""The layout is the architecture: the shared library (src/cotrain) imports neither side nor the program, and the
two sides (node/, coordinator/) never import each other. Checked on the source (every import statement, at module
level or inside a function) and at run time (importing every library module loads no side)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: folder -> the cotrain packages its code must never import
FORBIDDEN = {
    "src/cotrain": ("cotrain.node", "cotrain.coordinator", "cotrain.cli"),
    "node": ("cotrain.coordinator", "cotrain.cli"),
    "coordinator": ("cotrain.node", "cotrain.cli"),
}


def imported_modules(source: str, package: str) -> set[str]:
    """Every module a file's import statements name, relative imports resolved against ``package``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)  # `from cotrain import node`
    return out


def violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT / folder)
        package = ".".join(("cotrain", *rel.parent.parts)) if folder == "src/cotrain" else "x"
        for module in sorted(imported_modules(path.read_text(), package)):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                found.append(f"{folder}/{rel} imports {module}")
    return found


def test_imported_modules_sees_every_form_of_import():
    source = ("import cotrain.node.runner\nfrom cotrain import coordinator\n"
              "def f():\n    from cotrain.cli.launch import Proc\n    from ..node import x\n")
    found = imported_modules(source, "cotrain.sub")
    assert {"cotrain.node.runner", "cotrain.coordinator", "cotrain.cli.launch", "cotrain.node"} <= found


def test_the_library_and_the_sides_import_only_what_they_may():
    found = [v for folder, forbidden in FORBIDDEN.items() for v in violations(folder, forbidden)]
    assert found == []


def test_importing_every_library_module_loads_no_side():
    modules = sorted(".".join(("cotrain", *p.relative_to(ROOT / "src/cotrain").with_suffix("").parts))
                     .removesuffix(".__init__") for p in (ROOT / "src/cotrain").rglob("*.py"))
    script = ("import importlib, sys\n"
              f"for m in {modules!r}: importlib.import_module(m)\n"
              "sides = ('cotrain.node', 'cotrain.coordinator', 'cotrain.cli')\n"
              "print(sorted(m for m in sys.modules if m in sides or m.startswith(tuple(s + '.' for s in sides))))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
