"""The distribution: the wheel and the sdist ship every module and data file of the four source folders, the wheel
installed outside the checkout runs a node that trains, the README's "Join a run" commands work as written, and
``cotrain --version`` prints the installed version.

One wheel and one sdist are built per run of this file (offline: setuptools from this venv, build files in a temp
dir, so that nothing is written into the checkout), and one coordinator serves both swarm tests.
"""

from __future__ import annotations

import email
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from cotrain.cli.launch import Proc, wait_for
from cotrain.cli.local_swarm import Swarm
from cotrain.client import CoordinatorClient

from tiny_swarm import tiny_config
from packaging_checks import (data_references, drop_option, first_code_block, installed_files, missing,
                              python_modules, requirement_name, section, shell_commands, third_party_imports,
                              tree_files, undeclared, wheel_files)

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]

# PEP 517 hooks, as pip calls them; a setuptools deprecation in the project's build configuration is an error
BUILD = """
import json, pathlib, sys, warnings
from setuptools import build_meta
from setuptools.warnings import SetuptoolsDeprecationWarning
warnings.simplefilter("error", SetuptoolsDeprecationWarning)
out = pathlib.Path(sys.argv[1])
names = [build_meta.build_wheel(str(out)), build_meta.build_sdist(str(out))]
(out / "built.json").write_text(json.dumps(names))
"""


def build(project: Path, out: Path) -> tuple[Path, Path]:
    """Build ``project``'s wheel and sdist into ``out`` with this venv's setuptools; -> (wheel, sdist). setuptools'
    build and egg-info folders go to ``out`` too (DIST_EXTRA_CONFIG), never into the project."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "build.cfg"
    cfg.write_text(f"[build]\nbuild_base = {out / 'build'}\n[egg_info]\negg_base = {out}\n")
    done = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=project, capture_output=True, text=True,
                          env=dict(os.environ, DIST_EXTRA_CONFIG=str(cfg)), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    wheel_name, sdist_name = json.loads((out / "built.json").read_text())
    return out / wheel_name, out / sdist_name


def pip(*args: str, timeout: float = 600) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def clean_env(**extra: str) -> dict:
    """This environment without anything that points Python at the checkout or at this venv."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not Path(p).resolve().is_relative_to(ROOT))
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


class CommandProc(Proc):
    """:class:`cotrain.cli.launch.Proc` (own process group, log file, SIGTERM then kill on stop) for any command line,
    in a working directory of its own."""

    def __init__(self, name: str, argv: list[str], log_path: Path, cwd: Path, env: dict):
        self.name, self.log_path = name, Path(log_path)
        self._log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)


def node_row(client: CoordinatorClient, name: str):
    rows = [n for n in client.health().nodes if n.node_name == name]
    return rows[0] if rows else None


# ---- fixtures: one build, one install, one coordinator ------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, set[str]]:
    """(wheel, sdist, the files of the source folders when they were built: others may edit the tree meanwhile)."""
    expected = tree_files(ROOT) | data_references(ROOT)
    return (*build(ROOT, tmp_path_factory.mktemp("dist")), expected)


@pytest.fixture(scope="module")
def wheel(built) -> Path:
    return built[0]


@pytest.fixture(scope="module")
def wheel_target(wheel, tmp_path_factory) -> Path:
    """The wheel installed with ``pip --target`` (no dependencies, no byte-compiling: a module's .pyc appears there
    only when a process imports it from there)."""
    target = tmp_path_factory.mktemp("wheel-target")
    pip("install", "-q", "--no-deps", "--no-compile", "--target", str(target), str(wheel))
    return target


@pytest.fixture(scope="module")
def shared_coordinator(tmp_path_factory, corpus_file):
    with Swarm(tiny_config(corpus_file), tmp_path_factory.mktemp("coordinator")) as running:
        yield running


# ---- the pure checks ---------------------------------------------------------------------------------------------
def test_missing_reports_a_module_or_data_file_a_listing_lacks():
    expected = tree_files(ROOT)
    assert missing(expected, expected) == []
    assert missing(expected, expected - {"cotrain/node/runner.py"}) == ["cotrain/node/runner.py"]
    # what the hand-kept package list used to build: no cotrain.tasks, so the wheel crashed on import
    old_wheel = {f for f in expected if not f.startswith("cotrain/tasks/")}
    assert missing(expected, old_wheel) == sorted(f for f in expected if f.startswith("cotrain/tasks/"))
    assert "cotrain/tasks/__init__.py" in missing(expected, old_wheel)
    assert missing(expected, expected - {"cotrain/coordinator/dashboard.html"}) == ["cotrain/coordinator/dashboard.html"]


def test_tree_files_maps_the_four_source_folders_and_skips_caches(tmp_path):
    for rel in ("src/cotrain/__init__.py", "src/cotrain/sub/mod.py", "src/cotrain/sub/deeper/x.pyi",
                "src/cotrain/__pycache__/__init__.cpython-311.pyc", "src/cotrain/.mod.py.swp", "src/cotrain/a.py~",
                "node/__init__.py", "node/data.json", "coordinator/__init__.py", "coordinator/page.html",
                "cli/__init__.py", "tests/test_x.py", "bench/b.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert tree_files(tmp_path) == {"cotrain/__init__.py", "cotrain/sub/mod.py", "cotrain/sub/deeper/x.pyi",
                                    "cotrain/node/__init__.py", "cotrain/node/data.json",
                                    "cotrain/coordinator/__init__.py", "cotrain/coordinator/page.html",
                                    "cotrain/cli/__init__.py"}
    assert python_modules(tree_files(tmp_path)) == {"cotrain", "cotrain.sub.mod", "cotrain.node",
                                                    "cotrain.coordinator", "cotrain.cli"}


def test_data_references_finds_the_files_the_code_reads(tmp_path):
    (tmp_path / "src/cotrain").mkdir(parents=True)
    (tmp_path / "node").mkdir()
    (tmp_path / "coordinator").mkdir()
    (tmp_path / "coordinator/web.py").write_text(
        'from importlib import resources\n'
        'PAGE = resources.files("cotrain.coordinator").joinpath("static").joinpath("app.js").read_bytes()\n'
        'OTHER = (Path(plotly.__file__).parent / "plotly.min.js")\n')
    (tmp_path / "node/x.py").write_text('SCHEMA = Path(__file__).parent / "schemas" / "a.json"\n'
                                        'UP = Path(__file__).resolve().parent.parent / "top.txt"\n')
    assert data_references(tmp_path) == {"cotrain/coordinator/static/app.js", "cotrain/node/schemas/a.json",
                                         "cotrain/top.txt"}
    # and in this checkout it finds the dashboard (so the wheel test below really checks it)
    assert "cotrain/coordinator/dashboard.html" in data_references(ROOT)


def test_the_readme_join_block_parses():
    block = first_code_block(section((ROOT / "README.md").read_text(), "Join a run"))
    commands = shell_commands(block)
    assert any(argv[:3] == ["cotrain", "node", "join"] for argv in commands), commands
    assert drop_option(["pip", "install", "torch", "--index-url", "U", "--index-url=V", "-q"], "--index-url") == \
        (["pip", "install", "torch", "-q"], ["U", "V"])


def test_undeclared_reports_an_import_no_declared_distribution_provides():
    providers = {"cryptography": ["cryptography"], "google": ["googleapis-common-protos", "protobuf"],
                 "grpc_health": ["grpcio-health-checking"], "yaml": ["PyYAML"]}
    declared = ["protobuf", "grpcio_health_checking"]
    assert undeclared(["google", "grpc_health"], providers, declared) == []
    assert undeclared(["cryptography", "google", "yaml", "not_installed"], providers, declared) == \
        ["cryptography", "not_installed", "yaml"]


def test_third_party_imports_skips_stdlib_cotrain_and_optional_imports(tmp_path):
    for folder in ("src/cotrain", "node", "coordinator"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "node/x.py").write_text("import os, json\nimport torch.nn as nn\nfrom cotrain.config import X\n"
                                        "from . import y\nfrom grpc_health.v1 import health\n"
                                        "try:\n    import uvloop\nexcept ImportError:\n    uvloop = None\n"
                                        "def f():\n    import yaml\n")
    assert third_party_imports(tmp_path) == {"torch": {"cotrain/node/x.py"}, "grpc_health": {"cotrain/node/x.py"},
                                             "yaml": {"cotrain/node/x.py"}}


# ---- the wheel and the sdist ---------------------------------------------------------------------------------------
def test_the_wheel_ships_every_module_and_data_file(built):
    wheel_path, _, expected = built
    shipped = wheel_files(wheel_path)
    assert missing(expected, shipped) == [], "the wheel lacks files of the source folders"
    assert "cotrain/coordinator/dashboard.html" in expected and "cotrain/v1/coordinator_pb2.pyi" in expected
    assert {"cotrain.tasks", "cotrain.node.runner", "cotrain.coordinator.server", "cotrain.v1.coordinator_pb2"} <= \
        python_modules(shipped)
    assert not [f for f in shipped if "__pycache__" in f or f.endswith((".pyc", ".pyo"))]


def test_the_wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(z.read(f"{info}/METADATA"))
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert meta["Name"] == "cotrain" and meta["Version"] == VERSION
    assert meta["License-Expression"] == "Apache-2.0"
    assert not [c for c in meta.get_all("Classifier", []) if c.startswith("License ::")]  # superseded by the SPDX
    assert meta["Requires-Python"] == PYPROJECT["project"]["requires-python"]
    requires = meta.get_all("Requires-Dist")
    assert any(r.startswith("torch") for r in requires) and "cryptography>=41" in requires
    assert meta.get_all("Project-URL")
    assert re.search(r"^cotrain\s*=\s*cotrain\.cli:main$", entry_points, re.M)


def test_every_imported_distribution_is_a_dependency(wheel):
    """The code imports no third-party module that the wheel's own requirements do not name (cryptography, say,
    arriving only through hivemind's requirements would break when hivemind drops it)."""
    with zipfile.ZipFile(wheel) as z:
        info = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = email.message_from_bytes(z.read(info)).get_all("Requires-Dist")
    declared = [requirement_name(r) for r in requires if "extra ==" not in r]
    imports = third_party_imports(ROOT)
    assert "torch" in imports and "hivemind" in imports  # the scan sees the code's imports
    gaps = undeclared(imports, importlib.metadata.packages_distributions(), declared)
    assert gaps == [], {name: sorted(imports[name]) for name in gaps}


def test_a_new_source_folder_ships_without_editing_the_build(tmp_path):
    """A package folder (with or without __init__.py) and a data file added anywhere under the four source folders
    land in the wheel: nothing lists them by hand."""
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    for rel in ("src/cotrain/__init__.py", "src/cotrain/brand_new/__init__.py", "src/cotrain/brand_new/mod.py",
                "src/cotrain/brand_new/namespace_only/leaf.py", "src/cotrain/brand_new/table.json",
                "node/__init__.py", "node/extra/__init__.py", "coordinator/__init__.py", "coordinator/static/app.js",
                "cli/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    wheel_path, _ = build(tmp_path, tmp_path / "out")
    shipped = wheel_files(wheel_path)
    assert missing(tree_files(tmp_path), shipped) == []
    assert {"cotrain/brand_new/namespace_only/leaf.py", "cotrain/brand_new/table.json",
            "cotrain/coordinator/static/app.js", "cotrain/node/extra/__init__.py"} <= shipped


def test_the_sdist_installs_the_same_files_as_the_wheel(built, tmp_path):
    wheel_path, sdist, expected = built
    pip("install", "-q", "--no-deps", "--no-build-isolation", "--no-compile", "--target", str(tmp_path / "site"),
        str(sdist))
    installed = installed_files(tmp_path / "site")
    assert missing(expected, installed) == [], "installing the sdist lacks files of the source folders"
    assert installed == wheel_files(wheel_path)
    assert [d.name for d in (tmp_path / "site").glob("cotrain-*.dist-info")] == [f"cotrain-{VERSION}.dist-info"]
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert {"pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "protos/cotrain/v1/coordinator.proto",
            "tests/conftest.py"} <= names


# ---- cotrain --version ---------------------------------------------------------------------------------------------
def test_version(wheel_target, tmp_path):
    here = subprocess.run([sys.executable, "-m", "cotrain.cli", "--version"], capture_output=True, text=True, timeout=120)
    assert here.returncode == 0, here.stderr
    assert here.stdout.split() == ["cotrain", importlib.metadata.version("cotrain")]

    # the installed wheel, from outside the checkout: its own metadata
    env = clean_env(PYTHONPATH=str(wheel_target), PYTHONDONTWRITEBYTECODE="1")
    installed = subprocess.run([str(wheel_target / "bin" / "cotrain"), "--version"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout.split() == ["cotrain", VERSION]

    # a source tree that is not installed (no site-packages, so no metadata at all): pyproject.toml's version
    bare = subprocess.run([sys.executable, "-S", "-c", "import cotrain; print(cotrain.__version__)"], cwd=tmp_path,
                          env=clean_env(PYTHONPATH=str(ROOT / "src"), PYTHONDONTWRITEBYTECODE="1"),
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout.strip() == VERSION


# ---- swarm: the installed wheel trains ----------------------------------------------------------------------------
@pytest.mark.swarm
def test_a_node_from_the_installed_wheel_trains(wheel_target, shared_coordinator, tmp_path):
    coordinator = shared_coordinator
    work = tmp_path / "elsewhere"  # outside the checkout
    work.mkdir()
    env = clean_env(PYTHONPATH=str(wheel_target))

    # Python resolves cotrain from the wheel, not from the checkout (the venv's editable install comes after
    # PYTHONPATH: its finder is the last on sys.meta_path)
    probe = subprocess.run(
        [sys.executable, "-c", "import json, cotrain, cotrain.node, cotrain.coordinator, cotrain.tasks as t; "
                               "print(json.dumps([m.__file__ for m in (cotrain, cotrain.node, cotrain.coordinator, t)]))"],
        cwd=work, env=dict(env, PYTHONDONTWRITEBYTECODE="1"), capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    for path in json.loads(probe.stdout):
        assert Path(path).is_relative_to(wheel_target), path

    # the node process itself: the wheel was installed without .pyc files, so the runner's .pyc in the wheel's
    # folder shows that the node imported cotrain.node.runner from there
    runner_pyc = wheel_target / "cotrain" / "node" / "__pycache__" / f"runner.{sys.implementation.cache_tag}.pyc"
    assert not runner_pyc.exists()
    steps = 25  # two rounds of the tiny config's 10 inner steps
    node = CommandProc("wheel-node", [str(wheel_target / "bin" / "cotrain"), "node", "join", coordinator.address,
                                      "--token", coordinator.token, "--name", "wheel-node", "--insecure",
                                      "--max-steps", str(steps), "--threads", "1"],
                       tmp_path / "node.log", cwd=work, env=env)
    client = CoordinatorClient(coordinator.address, insecure=True)
    try:
        wait_for(lambda: not node.alive(), 300, interval=0.5, what="the node to take its steps and leave",
                 procs=[coordinator.proc])
        code = node.stop(10)
        assert code == 0, node.log()[-3000:]
        row = node_row(client, "wheel-node")
    finally:
        client.close()
        node.stop(10)
    assert runner_pyc.exists(), "the node did not import cotrain from the installed wheel"
    assert row is not None and row.state == "left", row
    assert row.metrics.step >= steps and row.metrics.round >= 1, row.metrics


# ---- swarm: the README's "Join a run", as written -----------------------------------------------------------------
def is_python(word: str) -> bool:
    return re.fullmatch(r"python(3(\.\d+)?)?", word) is not None


def is_pip(argv: list[str]) -> bool:
    return re.fullmatch(r"pip3?", argv[0]) is not None or (is_python(argv[0]) and argv[1:3] == ["-m", "pip"])


#: COTRAIN_TEST_FULL_VENV=1: the README test's venv downloads and installs every dependency itself
FULL_VENV = os.environ.get("COTRAIN_TEST_FULL_VENV") == "1"
NOT_LAYERED = re.compile(r"(cotrain|__editable__|pip|__pycache__)([-_.].*)?$|.*\.pth$")


def layer_dependencies(venv: Path, overlay: Path) -> None:
    """Give the fresh ``venv`` the distributions installed in this test's environment (cotrain and pip aside),
    through one .pth line to a folder of links to them: pip in ``venv`` then finds the dependencies installed
    instead of downloading them, and cannot remove them (they lie outside its environment). The venv's own
    setuptools, if its Python bundles one, goes first: torch requires a newer one, which pip would otherwise
    download to replace it."""
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "setuptools"], capture_output=True, timeout=120)
    overlay.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not NOT_LAYERED.match(entry.name):
            (overlay / entry.name).symlink_to(entry)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "_cotrain_test_dependencies.pth").write_text(f"{overlay}\n")


@pytest.mark.swarm
def test_the_readme_join_commands_work_as_written(wheel, shared_coordinator, tmp_path):
    """Runs the README's "Join a run" code block, command by command, as a shell would in an empty folder: a fresh
    venv (``python -m venv``, from this interpreter's base Python, without system site-packages), torch first as
    the README pins it, then the project, then the join command against a real coordinator. The block is parsed
    from the README, so the test follows it when it changes (and fails on a command it does not know).

    Substitutions, each for a reason outside the README: torch's ``--index-url`` is dropped (tests must not need
    the network; pip takes the pinned version from the indexes configured on the machine); ``pip install .``
    installs the wheel built from ``.`` (what ``pip install .`` builds and installs; this file builds it once);
    the join command gets the running coordinator's address and token, and ``--insecure`` (the README's flag for a
    plaintext loopback coordinator). The node runs until it took a round of local steps, then gets SIGTERM, which
    the README says makes it leave cleanly (exit 0).

    The shortcut: a fresh venv that downloads torch and the ~95 other distributions took 62 s on an idle 2-core
    machine and 345 s on a busy one, so by default the fresh venv is given this environment's installed
    distributions (cotrain and pip aside) through a .pth file (:func:`layer_dependencies`): the README's
    pip commands still run as written and resolve the wheel's requirements, but find them installed (pip may not
    use an index then), and torch's line finds the pinned torch already there. What that leaves out, a dependency that pyproject.toml does not
    declare, ``test_every_imported_distribution_is_a_dependency`` checks. ``COTRAIN_TEST_FULL_VENV=1`` runs the
    full installation instead. The venv is deleted afterwards.
    """
    coordinator = shared_coordinator
    commands = shell_commands(first_code_block(section((ROOT / "README.md").read_text(), "Join a run")))
    work = tmp_path / "volunteer"
    work.mkdir()
    env = clean_env(PIP_REQUIRE_VIRTUALENV="1")  # a pip outside the venv would refuse to install
    venv = activated = None
    pips: list[list[str]] = []
    join = None
    node = None
    try:
        for argv in commands:
            assert join is None, f"a command after the join command: {argv}"
            if is_python(argv[0]) and argv[1:3] == ["-m", "venv"]:
                venv = work / [a for a in argv[3:] if not a.startswith("-")][-1]
                base = getattr(sys, "_base_executable", sys.executable)
                done = subprocess.run([base, *argv[1:]], cwd=work, env=env, capture_output=True, text=True,
                                      timeout=300)
                assert done.returncode == 0, done.stderr
                assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
                if not FULL_VENV:
                    layer_dependencies(venv, tmp_path / "dependencies")
                    env["PIP_NO_INDEX"] = "1"  # what the layer lacks is an error, never a download
            elif argv[0] in (".", "source"):
                assert venv is not None and (work / argv[1]).resolve() == (venv / "bin" / "activate").resolve(), argv
                env = dict(env, VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")
                activated = venv
            elif is_pip(argv):
                assert activated is not None, f"pip before the venv is activated: {argv}"
                argv, _ = drop_option(argv, "--index-url")
                exe = shutil.which(argv[0], path=env["PATH"])
                assert exe and Path(exe).parent == venv / "bin", exe
                args = [str(wheel) if a == "." else a for a in argv[1:]]
                pips.append(args)
                done = subprocess.run([exe, *args], cwd=work, env=env, capture_output=True, text=True, timeout=600)
                assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            elif argv[:3] == ["cotrain", "node", "join"]:
                join = argv
            else:
                pytest.fail(f"the README's Join a run block has a command this test does not know: {argv}")
        assert join is not None, "the README's Join a run block has no `cotrain node join`"
        installs = [a for a in pips if a[0] == "install"]
        assert installs and any(a.startswith("torch") for a in installs[0]), "torch is not installed first"
        assert any(str(wheel) in a for a in installs), "the README does not install the project"

        # torch stayed the build the README pinned (installing the project did not replace it)
        pinned = [a.split("==", 1)[1] for a in installs[0] if a.startswith("torch==")]
        torch_version = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                                       cwd=work, env=env, capture_output=True, text=True, timeout=120).stdout.strip()
        if pinned:
            assert torch_version.split("+")[0] == pinned[0], torch_version

        # the join command, verbatim but for the coordinator's address and token (and --insecure: plaintext)
        assert len(join) > 3 and not join[3].startswith("-"), f"the coordinator's address comes first: {join}"
        argv = list(join)
        argv[3] = coordinator.address
        argv[argv.index("--token") + 1] = coordinator.token
        name = argv[argv.index("--name") + 1]
        exe = shutil.which("cotrain", path=env["PATH"])
        assert exe and Path(exe).parent == venv / "bin", exe
        node = CommandProc(name, [exe, *argv[1:], "--insecure"], tmp_path / "node.log", cwd=work, env=env)
        inner_steps = coordinator.cfg.averaging.inner_steps
        client = CoordinatorClient(coordinator.address, insecure=True)
        try:
            def trained():
                row = node_row(client, name)
                return row is not None and row.state != "left" and row.metrics.step >= inner_steps

            wait_for(trained, 300, interval=0.5, what="the README's node to take a round of local steps",
                     procs=[node, coordinator.proc])
            node.signal(signal.SIGTERM)
            wait_for(lambda: not node.alive(), 60, interval=0.2, what="the node to leave")
            code = node.stop(10)
            row = node_row(client, name)
        finally:
            client.close()
        assert code == 0, node.log()[-3000:]
        assert row.state == "left" and row.metrics.step >= inner_steps, row
        location = subprocess.run([str(venv / "bin" / "python"), "-c", "import cotrain; print(cotrain.__file__)"],
                                  cwd=work, env=env, capture_output=True, text=True, timeout=60).stdout.strip()
        assert Path(location).is_relative_to(venv), location
        site = next((venv / "lib").glob("python3*/site-packages"))
        assert installed_files(site) == wheel_files(wheel), "the venv's cotrain is not the wheel's"
    finally:
        if node is not None:
            node.stop(10)
        if venv is not None:
            shutil.rmtree(venv, ignore_errors=True)
