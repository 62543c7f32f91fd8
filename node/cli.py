"""``cotrain node ...``: the volunteer's commands.

Every option of ``cotrain node join`` can also come from a node config file (``--config node.toml``), so that a
volunteer need not type them each time; flags on the command line win over the file::

    coordinator = "coordinator.example.org:7450"
    token = "ct_..."
    name = "alice"
    max_cpus = 2
    max_memory = "4G"
    max_upload_mbps = 10
    only_when_idle = true
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import socket
import tomllib
from pathlib import Path

from cotrain.memory import limit_malloc_arenas, trace_allocations_from_env
from cotrain.node.limits import CpuTimeLimit, choose_cpus
from cotrain.node.options import FLAGS, OPTIONS, Flag, NodeOptions

__all__ = ["OPTIONS", "add_parser", "add_tls_flags", "resolve_options"]


def add_tls_flags(parser: argparse.ArgumentParser, default=False) -> None:
    """--ca and --insecure, which exclude each other (for every command that talks to a coordinator).
    ``default=argparse.SUPPRESS`` leaves unset flags absent, so that a config file can fill them."""
    group = parser.add_mutually_exclusive_group()
    for flag in (OPTIONS["ca"], OPTIONS["insecure"]):
        _add(group, flag, default if flag.kind is bool or default is argparse.SUPPRESS else None)


def _add(parser, flag: Flag, default) -> None:
    kwargs = dict(default=default, help=argparse.SUPPRESS if flag.hidden else flag.help)
    if flag.kind is bool:
        kwargs["action"] = "store_true"
    else:
        kwargs.update(type=flag.kind, metavar=flag.metavar, choices=flag.choices)
    parser.add_argument(flag.flag, **kwargs)


def add_parser(subparsers) -> None:
    node = subparsers.add_parser("node", help="run a volunteer node").add_subparsers(dest="node_command",
                                                                                    metavar="COMMAND", required=True)
    join = node.add_parser("join", help="join a coordinator's run and train until stopped",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    S = argparse.SUPPRESS  # unset flags stay absent, so that the config file can fill them
    join.add_argument("coordinator", metavar="COORDINATOR", nargs="?", default=S, help=OPTIONS["coordinator"].help)
    join.add_argument("--config", type=Path, default=None, help="node config file (TOML) with any of these options")
    limits = join.add_argument_group("your limits")
    for flag in FLAGS:
        if flag.group == "" and flag.name != "coordinator":
            _add(join, flag, S)
        elif flag.group == "limits":
            _add(limits, flag, S)
    add_tls_flags(join, S)
    join.set_defaults(handler=cmd_join)


def _read_config(path: Path) -> dict:
    """A node config file's values, each checked against its flag's kind; an error names the key."""
    try:
        loaded = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise SystemExit(f"--config: cannot read {path}: {e.strerror or e}")
    except tomllib.TOMLDecodeError as e:
        raise SystemExit(f"--config: {path} is not valid TOML: {e}")
    values = {}
    for key, value in loaded.get("node", loaded).items():
        if key not in OPTIONS:
            raise SystemExit(f"--config: unknown key {key!r} in {path}")
        kind = OPTIONS[key].kind
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SystemExit(f"--config: {key} must be {kind.__name__}, got {value!r}")
        values[key] = value
    return values


def _check(flag: Flag, value) -> None:
    if flag.limits is not None and not flag.limits[0] <= value <= flag.limits[1]:
        low, high = flag.limits
        allowed = f">= {low:g}" if high == float("inf") else f"in {low:g}..{high:g}"
        raise SystemExit(f"{flag.flag}: must be {allowed}, got {value}")
    if flag.choices is not None and value and value not in flag.choices:
        raise SystemExit(f"{flag.flag}: must be one of {', '.join(flag.choices)}, got {value!r}")


def resolve_options(args: argparse.Namespace) -> dict:
    """Command line over config file over defaults, each value checked; a bad one names its flag or key.
    -> the :class:`NodeOptions` fields the volunteer set (converted: "4G" -> bytes, ...) and the defaults of the
    others."""
    values = _read_config(args.config) if getattr(args, "config", None) is not None else {}
    values.update({name: getattr(args, name) for name in OPTIONS if hasattr(args, name)})
    if not values.get("coordinator"):
        raise SystemExit("node join: give the coordinator's HOST:PORT (or `coordinator` in --config)")
    if not values.get("token"):
        raise SystemExit("--token: required (or `token` in --config)")
    if values.get("ca") and values.get("insecure"):
        raise SystemExit("--ca and --insecure exclude each other")
    out = {f.name: f.default for f in dataclasses.fields(NodeOptions) if f.default is not dataclasses.MISSING}
    for name, value in values.items():
        flag = OPTIONS[name]
        _check(flag, value)
        try:
            out[name] = flag.convert(value) if flag.convert is not None else value
        except ValueError as e:
            raise SystemExit(str(e) if str(e).startswith(flag.flag) else f"{flag.flag}: {e}")
    out["name"] = out.get("name") or socket.gethostname()
    return out


def cmd_join(args) -> int:
    arenas = limit_malloc_arenas()  # before torch's and hivemind's threads allocate
    logging.getLogger("cotrain.node.runner").info("%s", arenas)
    tracing = trace_allocations_from_env("node")  # COTRAIN_TRACEMALLOC: bench/soak.py --tracemalloc
    if tracing:
        logging.getLogger("cotrain.node.runner").info("%s", tracing)
    from cotrain.node.runner import Node  # torch and hivemind: only when a node really starts

    options = NodeOptions(**resolve_options(args))
    if options.cpus:  # CPUs this process may not use: say so before joining, not after
        try:
            choose_cpus(os.sched_getaffinity(0), options.cpus)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    with contextlib.ExitStack() as stack:
        if options.cpu_limit:  # before the node starts a thread or a process: each one it starts is inside it
            try:
                limit = stack.enter_context(CpuTimeLimit(options.cpu_limit))
            except ValueError as e:
                raise SystemExit(str(e)) from None
            logging.getLogger("cotrain.node.runner").info("%s", limit.describe())
        Node(options).run()
    return 0
