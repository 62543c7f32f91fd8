"""Rooms one can live in: no class over about 300 lines, no hand-written module over 500, in the library, both
sides and the program (generated protobuf code aside). A part that outgrows this is split by job, not squeezed."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("src/cotrain", "node", "coordinator", "cli")
MAX_CLASS_LINES = 310  # "about 300"
MAX_MODULE_LINES = 500


def too_big(source: str, name: str) -> list[str]:
    """What in one module's ``source`` is over the limits, in words."""
    found = [f"{name}: {source.count(chr(10))} lines"] if source.count("\n") > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
            found.append(f"{name}: class {node.name} is {node.end_lineno - node.lineno + 1} lines")
    return found


def test_the_check_sees_a_long_class_and_a_long_module():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    assert too_big(f"class Big:\n{body}\n", "big.py") == [f"big.py: class Big is {MAX_CLASS_LINES + 1} lines"]
    assert too_big(f"class Fits:\n{body[:body.rindex(chr(10))]}\n", "fits.py") == []
    assert too_big("x = 1\n" * (MAX_MODULE_LINES + 1), "long.py") == [f"long.py: {MAX_MODULE_LINES + 1} lines"]


def test_no_class_or_module_is_over_the_limits():
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "_pb2" not in path.name:
                found += too_big(path.read_text(), str(path.relative_to(ROOT)))
    assert found == []
