"""The deployment files under deploy/: they parse, they hold what their tools expect, and every ``cotrain`` command
line in them names subcommands and flags that the ``cotrain`` command really has.

Fast and offline: no Docker, no cluster, no coordinator; the only processes started are ``cotrain ... --help``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
UNIT = DEPLOY / "systemd" / "cotrain-node.service"
NODE_TOML = DEPLOY / "systemd" / "node.toml.example"

YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
JSON_FILES = sorted(DEPLOY.rglob("*.json"))


def rel(path: Path) -> str:
    return str(path.relative_to(DEPLOY))


def load_yaml_docs(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


# ---- the files parse ---------------------------------------------------------------------------------------------
def test_deploy_has_the_expected_files():
    for name in ("Dockerfile", "compose.yaml", "prometheus.yml", "run.toml", "README.md", "k8s/coordinator.yaml",
                 "k8s/nodes.yaml", "k8s/raycluster.yaml", "k8s/secret.example.yaml", "systemd/cotrain-node.service",
                 "systemd/node.toml.example", "grafana/cotrain-dashboard.json",
                 "grafana/provisioning/datasources/prometheus.yaml", "grafana/provisioning/dashboards/cotrain.yaml"):
        assert (DEPLOY / name).is_file(), f"deploy/{name} is missing"


@pytest.mark.parametrize("path", YAML_FILES, ids=rel)
def test_yaml_parses(path):
    docs = load_yaml_docs(path)
    assert docs, f"{rel(path)}: no YAML document"
    assert all(isinstance(doc, dict) for doc in docs), f"{rel(path)}: a document is not a mapping"


@pytest.mark.parametrize("path", JSON_FILES, ids=rel)
def test_json_parses(path):
    assert isinstance(json.loads(path.read_text()), dict)


# ---- Docker and compose ------------------------------------------------------------------------------------------
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in DOCKERFILE.read_text().splitlines()
                                           if not line.lstrip().startswith("#")))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile():
    ins = dockerfile_instructions()
    get = lambda name: [args for word, args in ins if word == name]
    assert get("FROM") == ["python:3.11-slim"]
    assert json.loads(get("ENTRYPOINT")[-1]) == ["cotrain"]
    assert "TORCH_INDEX_URL=" in get("ARG"), "TORCH_INDEX_URL must be an ARG with an empty default (PyPI)"
    assert any("torch==" in run for run in get("RUN"))
    # the image installs the built wheel, as a package index would serve it, never the source tree
    assert any(run.startswith("pip wheel") for run in get("RUN"))
    assert any(run.startswith("pip install") and ".whl" in run for run in get("RUN"))
    assert get("USER") and get("USER")[-1] not in ("root", "0"), "the image must not run as root"
    assert "/var/lib/cotrain" in get("VOLUME")
    assert set(" ".join(get("EXPOSE")).split()) >= {"7450", "7451"}
    assert "://" not in DOCKERFILE.read_text(), "no host names in the Dockerfile: indexes come in as build args"


def test_compose_services():
    compose = load_yaml_docs(COMPOSE)[0]
    services = compose["services"]
    assert set(services) >= {"coordinator", "node", "prometheus", "grafana"}
    assert services["coordinator"]["image"] == services["node"]["image"] == "cotrain"
    assert services["node"]["deploy"]["replicas"] == 3
    assert any(str(v).split(":")[1] == "/var/lib/cotrain" for v in services["coordinator"]["volumes"])
    assert "${COTRAIN_TOKEN}" in services["node"]["command"]
    # every file the compose file mounts exists (paths are relative to deploy/)
    for service in services.values():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"compose.yaml mounts {source}, which does not exist"


def test_prometheus_scrapes_the_coordinator():
    cfg = load_yaml_docs(DEPLOY / "prometheus.yml")[0]
    jobs = cfg["scrape_configs"]
    assert any(job.get("metrics_path", "/metrics") == "/metrics" and
               "coordinator:7451" in [t for sc in job["static_configs"] for t in sc["targets"]] for job in jobs)


def test_grafana_provisioning_points_at_the_dashboard():
    compose = load_yaml_docs(COMPOSE)[0]
    datasources = load_yaml_docs(DEPLOY / "grafana/provisioning/datasources/prometheus.yaml")[0]["datasources"]
    assert any(ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090" for ds in datasources)
    providers = load_yaml_docs(DEPLOY / "grafana/provisioning/dashboards/cotrain.yaml")[0]["providers"]
    folders = {p["options"]["path"] for p in providers}
    mounts = [str(v).split(":") for v in compose["services"]["grafana"]["volumes"]]
    dashboard_targets = [target for source, target, *_ in mounts if source == "./grafana/cotrain-dashboard.json"]
    assert dashboard_targets and str(Path(dashboard_targets[0]).parent) in folders


def test_run_toml_is_a_valid_run_config():
    from cotrain.config import RunConfig

    cfg = RunConfig.load(DEPLOY / "run.toml")
    assert cfg.run.name


# ---- Kubernetes --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, kinds", [
    ("coordinator.yaml", {"StatefulSet", "Service"}),
    ("nodes.yaml", {"Deployment"}),
    ("raycluster.yaml", {"RayCluster"}),
    ("secret.example.yaml", {"Secret"}),
])
def test_k8s_kinds(name, kinds):
    docs = load_yaml_docs(K8S / name)
    assert kinds <= {doc["kind"] for doc in docs}
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("metadata", {}).get("name"), f"{name}: {doc.get('kind')} incomplete"


def test_k8s_coordinator_statefulset():
    docs = load_yaml_docs(K8S / "coordinator.yaml")
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert sts["spec"]["replicas"] == 1
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    container = sts["spec"]["template"]["spec"]["containers"][0]
    state_mounts = [m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/cotrain"]
    assert state_mounts and state_mounts[0]["name"] in claims, "the state dir must live on the claim template"
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "cotrain-coordinator")
    assert {7450, 7451} <= {p["port"] for p in service["spec"]["ports"]}


def test_k8s_join_token_comes_from_the_secret():
    secret = load_yaml_docs(K8S / "secret.example.yaml")[0]
    assert "EXAMPLE" in secret["stringData"]["token"]
    for name in ("nodes.yaml", "raycluster.yaml"):
        refs = [env["valueFrom"]["secretKeyRef"] for container in k8s_containers(load_yaml_docs(K8S / name))
                for env in container[1].get("env", []) if env["name"] == "COTRAIN_TOKEN"]
        assert refs and all(r == {"name": secret["metadata"]["name"], "key": "token"} for r in refs), name


def test_raycluster_says_volunteers_never_join():
    text = (K8S / "raycluster.yaml").read_text()
    assert load_yaml_docs(K8S / "raycluster.yaml")[0]["apiVersion"] == "ray.io/v1"
    assert "Volunteers never join" in text


# ---- systemd -----------------------------------------------------------------------------------------------------
def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_unit():
    s = unit_settings()
    (exec_start,) = s["ExecStart"]
    assert re.search(r"(^|/)cotrain node join ", exec_start)
    assert "--config /etc/cotrain/node.toml" in exec_start and "--state-dir /var/lib/cotrain-node" in exec_start
    assert s["Restart"] == ["on-failure"] and s["Nice"] == ["10"] and s["StateDirectory"] == ["cotrain-node"]
    assert "CPUWeight" in s and s["User"][0] not in ("root", "0")


def test_node_toml_example_loads():
    from cotrain.node.cli import OPTIONS, resolve_options

    options = resolve_options(argparse.Namespace(config=NODE_TOML))
    assert options["max_memory"] == 4 * 1024 ** 3
    assert options["coordinator"] and options["token"] and options["only_when_idle"] is True
    assert set(tomllib.loads(NODE_TOML.read_text())) <= set(OPTIONS)


# ---- every cotrain command line uses subcommands and flags that exist ----------------------------------------------
def k8s_containers(docs) -> list[tuple[str, dict]]:
    """(name, container) of every container anywhere in these manifests (pod templates, RayCluster groups)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    found.extend((c.get("name", "?"), c) for c in value if isinstance(c, dict))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(docs)
    return found


SHELLS = {"sh", "bash", "dash", "zsh"}
#: a `cotrain` word in shell text; the command runs to the end of the line or a shell operator
COTRAIN_IN_SHELL = re.compile(r"(?<![\w.-])cotrain(?=[ \t]+([^\n;&|)`]*))")  # a lookahead: matches may overlap


@lru_cache(maxsize=None)
def top_commands() -> frozenset:
    return frozenset(subcommands(root_parser()))


@lru_cache(maxsize=None)
def root_parser() -> argparse.ArgumentParser:
    from cotrain.cli.main import build_parser

    return build_parser()


def subcommands(parser: argparse.ArgumentParser) -> dict:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def in_shell(text: str, prose: bool = False) -> list[list[str]]:
    """The argument lists of the ``cotrain`` commands in a piece of shell text (line continuations joined): those
    whose first word is a cotrain command (not an image name, as in `docker build -t cotrain .`). In ``prose``
    (comments), also only those whose subcommands all exist, so that a sentence ("the cotrain node that ...") is
    not taken for a command line."""
    out = []
    for match in COTRAIN_IN_SHELL.finditer(re.sub(r"\\[ \t]*\n[ \t]*", " ", text)):
        try:
            words = shlex.split(match.group(1))
        except ValueError:
            continue
        if not words or words[0] not in top_commands() or (prose and analyse(words)[2]):
            continue
        out.append(words)
    return out


def from_argv(argv: list[str], cotrain_entrypoint: bool) -> list[list[str]]:
    """The ``cotrain`` argument lists of an exec-form command (a shell's -c script is searched too)."""
    if not argv:
        return []
    head = Path(str(argv[0])).name
    if head == "cotrain":
        return [[str(w) for w in argv[1:]]]
    if head in SHELLS and "-c" in argv:
        script = [w for w in argv[argv.index("-c") + 1:] if w != "--"]
        return in_shell(script[0]) if script else []
    if head in ("python", "python3") and argv[1:3] == ["-m", "cotrain"]:
        return [[str(w) for w in argv[3:]]]
    return [[str(w) for w in argv]] if cotrain_entrypoint else []


def comment_text(path: Path) -> str:
    return "\n".join(line.split("#", 1)[1][1:] for line in path.read_text().splitlines()
                     if line.lstrip().startswith("#"))


def command_lines() -> list[tuple[str, list[str]]]:
    """(where, argv after `cotrain`) of every cotrain command line in deploy/."""
    found: list[tuple[str, list[str]]] = []

    def add(where, argvs):
        found.extend((where if len(argvs) == 1 else f"{where}#{i}", a) for i, a in enumerate(argvs))

    # the Dockerfile: its CMD runs after the `cotrain` entrypoint
    for word, args in dockerfile_instructions():
        if word == "CMD":
            add("Dockerfile:CMD", from_argv(json.loads(args), cotrain_entrypoint=True))
    # compose: the command of every service on the cotrain image
    compose = load_yaml_docs(COMPOSE)[0]
    for name, service in compose["services"].items():
        if "command" in service:
            command = service["command"]
            argv = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
            entrypoint = service.get("entrypoint")
            if entrypoint:
                argv = (shlex.split(entrypoint) if isinstance(entrypoint, str) else list(entrypoint)) + argv
            add(f"compose.yaml:{name}", from_argv(argv, cotrain_entrypoint=not entrypoint and
                                                  str(service.get("image", "")).startswith("cotrain")))
    # Kubernetes: every container's command and args
    for path in sorted(K8S.glob("*.yaml")):
        for name, container in k8s_containers(load_yaml_docs(path)):
            argv = [str(w) for w in container.get("command", []) + container.get("args", [])]
            uses_entrypoint = "command" not in container and str(container.get("image", "")).startswith("cotrain")
            add(f"k8s/{path.name}:{name}", from_argv(argv, cotrain_entrypoint=uses_entrypoint))
    # systemd: ExecStart (minus its special prefixes)
    for value in unit_settings().get("ExecStart", []):
        add("systemd/cotrain-node.service:ExecStart", from_argv(shlex.split(value.lstrip("-@:+!")), False))
    # examples in comments and in the README's code
    for path in [DOCKERFILE, COMPOSE, *sorted(K8S.glob("*.yaml")), UNIT]:
        add(f"{rel(path)}:comment", in_shell(comment_text(path), prose=True))
    readme = (DEPLOY / "README.md").read_text()
    code = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", readme, re.S) + re.findall(r"`([^`\n]+)`", readme))
    add("README.md", in_shell("\n".join(line for line in code.splitlines() if not line.lstrip().startswith("#"))))
    return found


def analyse(argv: list[str]) -> tuple[tuple[str, ...], list[tuple[tuple[str, ...], str]], list[str]]:
    """Walk an argument list as cotrain's parser would: the subcommand path, each flag with the path of the parser
    that must accept it, and problems (a word where a subcommand must be)."""
    parser, path, flags, problems = root_parser(), [], [], []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("-") and word != "-":
            flag = word.split("=", 1)[0]
            flags.append((tuple(path), flag))
            action = parser._option_string_actions.get(flag)
            if action is not None and action.nargs != 0 and "=" not in word:
                i += 1  # its value
        else:
            choices = subcommands(parser)
            if choices:
                if word not in choices:
                    problems.append(f"{' '.join(['cotrain', *path])}: no subcommand {word!r} "
                                    f"(has {', '.join(sorted(choices))})")
                    break
                parser = choices[word]
                path.append(word)
        i += 1
    if subcommands(parser) and not problems and not any(f in ("-h", "--help") for _, f in flags):
        problems.append(f"{' '.join(['cotrain', *path])}: needs a subcommand")
    return tuple(path), flags, problems


COMMAND_LINES = command_lines()


def test_command_lines_were_found_everywhere():
    wheres = {re.split(r"[:#]", where)[0] for where, _ in COMMAND_LINES}
    assert {"Dockerfile", "compose.yaml", "k8s/coordinator.yaml", "k8s/nodes.yaml", "k8s/raycluster.yaml",
            "systemd/cotrain-node.service", "README.md"} <= wheres
    joined = {" ".join(argv[:2]) for _, argv in COMMAND_LINES}
    assert {"coordinator start", "node join"} <= joined


@lru_cache(maxsize=None)
def help_texts() -> dict[tuple[str, ...], tuple[int, str]]:
    """``cotrain ... --help`` of every subcommand path the command lines use, run in parallel."""
    paths = {()}
    for _, argv in COMMAND_LINES:
        path, flags, _ = analyse(argv)
        paths.add(path)
        paths.update(p for p, _ in flags)

    def run(path):
        proc = subprocess.run([sys.executable, "-m", "cotrain.cli", *path, "--help"], capture_output=True, text=True,
                              timeout=120, cwd=ROOT)
        return path, (proc.returncode, proc.stdout + proc.stderr)

    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        return dict(pool.map(run, sorted(paths)))


@pytest.mark.parametrize("where, argv", COMMAND_LINES,
                         ids=[f"{where}: cotrain {' '.join(argv[:3])}" for where, argv in COMMAND_LINES])
def test_command_line_uses_real_subcommands_and_flags(where, argv):
    path, flags, problems = analyse(argv)
    assert not problems, f"deploy/{where}: {'; '.join(problems)}"
    helps = help_texts()
    code, text = helps[path]
    assert code == 0, f"deploy/{where}: `cotrain {' '.join(path)} --help` exited {code}:\n{text}"
    missing = []
    for flag_path, flag in flags:
        code, text = helps[flag_path]
        if code != 0 or not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
            missing.append(f"{flag} (not in `cotrain {' '.join(flag_path)} --help`)")
    assert not missing, f"deploy/{where}: `cotrain {' '.join(argv)}` uses unknown flags: {', '.join(missing)}"
