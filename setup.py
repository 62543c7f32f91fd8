"""What goes into the distribution: every package and data file under its four source folders, found by walking
them, so that a new folder or data file cannot be left out by a hand-kept list. The metadata is in pyproject.toml.

One distribution, four source folders: the shared library (src/cotrain), the volunteer side (node/), the operator
side (coordinator/) and the program that puts both under one command line (cli/), importable as cotrain,
cotrain.node, cotrain.coordinator and cotrain.cli. Every folder under them
is a package (with or without ``__init__.py``), and every file in it that is not Python source is package data
(the dashboard's HTML, the generated ``.pyi`` stubs, ...). Caches, hidden files and editor backups are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent

#: import name -> source folder, relative to this file
SOURCES = {"cotrain": "src/cotrain", "cotrain.node": "node", "cotrain.coordinator": "coordinator",
           "cotrain.cli": "cli"}

SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".py", ".pyc", ".pyo", "~", ".swp", ".orig", ".rej")


def _skipped(name: str) -> bool:
    return name.startswith(".") or name in SKIP_DIRS or name.endswith(".egg-info")


def discover(root: Path = HERE) -> tuple[list[str], dict[str, list[str]]]:
    """-> (packages, package data) of the four source folders under ``root``."""
    packages: list[str] = []
    package_data: dict[str, list[str]] = {}
    for top, folder in SOURCES.items():
        base = root / folder
        if not base.is_dir():
            raise FileNotFoundError(f"source folder {folder}/ of package {top} is missing")
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not _skipped(d))
            relative = Path(dirpath).relative_to(base)
            name = ".".join((top, *relative.parts))
            files = sorted(f for f in filenames if not _skipped(f))
            if not files and not dirnames:
                continue
            packages.append(name)
            data = [f for f in files if not f.endswith(SKIP_SUFFIXES)]
            if data:
                package_data[name] = data
    return packages, package_data


PACKAGES, PACKAGE_DATA = discover()

setup(packages=PACKAGES, package_dir=SOURCES, package_data=PACKAGE_DATA, include_package_data=False)
