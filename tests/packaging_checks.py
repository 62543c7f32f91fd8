"""Pure checks behind tests/test_packaging.py: which files the distribution must ship, which of them a wheel (or an
installed tree) lacks, and the volunteer's commands in the README's "Join a run" section.

The listing of what must ship is written here again on purpose, independently of setup.py (which finds what to
build): a test that asked setup.py what to expect would pass whatever setup.py forgot.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import sys
import zipfile
from pathlib import Path
from typing import Iterable

#: source folder -> where its files land in an installed tree (or a wheel)
SOURCES = {"src/cotrain": "cotrain", "node": "cotrain/node", "coordinator": "cotrain/coordinator", "cli": "cotrain/cli"}

#: never shipped: caches, hidden files (editors, OS), editor backups and patch leftovers
JUNK_DIRS = {"__pycache__"}
JUNK_SUFFIXES = (".pyc", ".pyo", "~", ".swp", ".orig", ".rej")


def _junk(name: str) -> bool:
    return name.startswith(".") or name in JUNK_DIRS or name.endswith(".egg-info") or name.endswith(JUNK_SUFFIXES)


def tree_files(root: Path) -> set[str]:
    """Install paths ("cotrain/node/cli.py") of every file under the four source folders of the checkout at
    ``root``: every Python module and every data file, caches and editor leftovers aside."""
    out: set[str] = set()
    for folder, target in SOURCES.items():
        base = Path(root) / folder
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not _junk(d)]
            rel = Path(dirpath).relative_to(base)
            for name in filenames:
                if not _junk(name):
                    out.add("/".join((target, *rel.parts, name)))
    return out


def data_references(root: Path) -> set[str]:
    """Install paths of the files the code reads next to itself at run time: ``resources.files("pkg")
    .joinpath("name")`` and ``Path(__file__)...parent / "name"`` (the name as a string literal)."""
    refs: set[str] = set()
    files_call = re.compile(r"""resources\.files\(\s*["']([\w.]+)["']\s*\)((?:\s*\.joinpath\(\s*["'][^"']+["']\s*\))+)""")
    joinpath = re.compile(r"""joinpath\(\s*["']([^"']+)["']\s*\)""")
    own_file = re.compile(r"""Path\(__file__\)(?:\.resolve\(\))?((?:\.parent)+)((?:\s*/\s*["'][^"']+["'])+)""")
    segment = re.compile(r"""["']([^"']+)["']""")
    for path in sorted(p for p in tree_files(root) if p.endswith(".py")):
        source = Path(root) / _source_path(path)
        text = source.read_text()
        for package, chain in files_call.findall(text):
            refs.add("/".join((package.replace(".", "/"), *joinpath.findall(chain))))
        for parents, chain in own_file.findall(text):
            base = Path(path).parent
            for _ in range(parents.count(".parent") - 1):
                base = base.parent
            refs.add("/".join((*base.parts, *segment.findall(chain))))
    return refs


def _source_path(install_path: str) -> str:
    """The inverse of the SOURCES mapping: "cotrain/node/cli.py" -> "node/cli.py"."""
    for folder, target in sorted(SOURCES.items(), key=lambda item: -len(item[1])):
        if install_path == target or install_path.startswith(target + "/"):
            return folder + install_path[len(target):]
    raise ValueError(install_path)


def missing(expected: Iterable[str], shipped: Iterable[str]) -> list[str]:
    """The expected install paths that ``shipped`` lacks, sorted."""
    return sorted(set(expected) - set(shipped))


def wheel_files(wheel: Path) -> set[str]:
    """Install paths of the files in a wheel, its .dist-info aside."""
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if not n.endswith("/") and ".dist-info/" not in n}


def installed_files(target: Path, top: str = "cotrain") -> set[str]:
    """Install paths of the files of package ``top`` in an installed tree (a --target dir, site-packages), caches
    aside."""
    base = Path(target) / top
    out = set()
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in JUNK_DIRS]
        for name in filenames:
            out.add((Path(dirpath) / name).relative_to(target).as_posix())
    return out


def python_modules(paths: Iterable[str]) -> set[str]:
    """Dotted module names of the .py files among install paths ("cotrain/node/__init__.py" -> "cotrain.node")."""
    out = set()
    for p in paths:
        if p.endswith(".py"):
            parts = p[:-3].split("/")
            if parts[-1] == "__init__":
                parts.pop()
            out.add(".".join(parts))
    return out


# ---- dependencies ------------------------------------------------------------------------------------------------
def _optional(node: ast.AST, parents: dict) -> bool:
    """True for an import inside ``try: ... except ImportError`` (an optional dependency)."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.Try) and child in parent.body:
            for handler in parent.handlers:
                names = [n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)] if handler.type else []
                if {"ImportError", "ModuleNotFoundError"} & set(names):
                    return True
        child, parent = parent, parents.get(parent)
    return False


def third_party_imports(root: Path) -> dict[str, set[str]]:
    """Top-level names of the modules the code under the four source folders imports that are neither the
    standard library nor cotrain (optional imports, in ``try/except ImportError``, aside) -> files importing them."""
    out: dict[str, set[str]] = {}
    for path in sorted(p for p in tree_files(root) if p.endswith(".py")):
        tree = ast.parse((Path(root) / _source_path(path)).read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "cotrain" or _optional(node, parents):
                    continue
                out.setdefault(top, set()).add(path)
    return out


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalize(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def undeclared(imports: Iterable[str], providers: dict[str, list[str]], declared: Iterable[str]) -> list[str]:
    """The imported top-level names that no declared distribution provides (``providers``: top-level name ->
    distributions that install it, as importlib.metadata.packages_distributions() says), sorted; a name that no
    installed distribution provides counts as undeclared too."""
    wanted = {normalize(d) for d in declared}
    return sorted(name for name in imports if not {normalize(d) for d in providers.get(name, [])} & wanted)


# ---- the README -------------------------------------------------------------------------------------------------
def section(markdown: str, title: str) -> str:
    """The text of the ``## title`` section (up to the next ``## ``), its subsections included."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", markdown, re.S | re.M)
    if not match:
        raise ValueError(f"no section '## {title}'")
    return match.group(1)


def first_code_block(text: str) -> str:
    match = re.search(r"^```(?:sh|bash|console)?\n(.*?)^```", text, re.S | re.M)
    if not match:
        raise ValueError("no code block")
    return match.group(1)


def shell_commands(block: str) -> list[list[str]]:
    """Each command line of a shell code block as an argument list: continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", block)
    return [argv for argv in (shlex.split(line, comments=True) for line in text.splitlines()) if argv]


def drop_option(argv: list[str], option: str) -> tuple[list[str], list[str]]:
    """-> (argv without ``option VALUE`` / ``option=VALUE``, the values dropped)."""
    out, dropped, i = [], [], 0
    while i < len(argv):
        if argv[i] == option and i + 1 < len(argv):
            dropped.append(argv[i + 1])
            i += 2
            continue
        if argv[i].startswith(option + "="):
            dropped.append(argv[i].split("=", 1)[1])
        else:
            out.append(argv[i])
        i += 1
    return out, dropped

