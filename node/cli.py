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
import socket
import tomllib
from pathlib import Path

from cotrain.config import ATTACKS
from cotrain.node.limits import parse_size

#: option -> (type, default); the types also check the config file's values
OPTIONS = {
    "coordinator": (str, None), "token": (str, None), "name": (str, None), "state_dir": (str, None),
    "max_steps": (int, 0), "max_rounds": (int, 0), "duration": (float, 0.0), "threads": (int, 0),
    "wait_peers": (int, 0), "dht_host": (str, "127.0.0.1"), "dht_port": (int, 0), "dht_announce": (str, ""), "client_mode": (bool, False),
    "max_cpus": (int, 0), "max_memory": (str, ""), "max_upload_mbps": (float, 0.0), "only_when_idle": (bool, False),
    "ca": (str, None), "insecure": (bool, False), "attack": (str, ""), "assume_public": (bool, False),
}


def add_tls_flags(parser: argparse.ArgumentParser, default=False) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--ca", metavar="FILE", help="CA certificate that signed the coordinator's TLS certificate "
                                                    "(default: the system's roots)")
    group.add_argument("--insecure", action="store_true", default=default,
                       help="plaintext gRPC, for loopback demos and tests")


def add_parser(subparsers) -> None:
    node = subparsers.add_parser("node", help="run a volunteer node").add_subparsers(dest="node_command",
                                                                                    metavar="COMMAND", required=True)
    join = node.add_parser("join", help="join a coordinator's run and train until stopped",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    S = argparse.SUPPRESS  # unset flags stay absent, so that the config file can fill them
    join.add_argument("coordinator", metavar="COORDINATOR", nargs="?", default=S,
                      help="the coordinator's HOST:PORT (or `coordinator` in --config)")
    join.add_argument("--config", type=Path, default=None, help="node config file (TOML) with any of these options")
    join.add_argument("--token", default=S, help="join token the operator gave you")
    join.add_argument("--name", default=S, help="name shown on the dashboard (default: hostname)")
    join.add_argument("--state-dir", default=S, help="keeps this node's identity, so a restart resumes as the same node")
    join.add_argument("--max-steps", type=int, default=S, help="leave after this many local steps (0: never)")
    join.add_argument("--max-rounds", type=int, default=S, help="leave after this many averaging rounds (0: never)")
    join.add_argument("--duration", type=float, default=S, help="leave after this many seconds (0: never)")
    join.add_argument("--threads", type=int, default=S, help="torch threads for training (0: torch's default)")
    join.add_argument("--wait-peers", type=int, default=S,
                      help="before training, wait (up to 5 minutes) until this many peers are in the swarm")
    join.add_argument("--dht-host", default=S, help="address the DHT peer listens on (default 127.0.0.1: this "
                                                     "machine only; 0.0.0.0 lets other volunteers connect)")
    join.add_argument("--dht-port", type=int, default=S,
                      help="port the DHT peer listens on (default 0: any free port; fix it to forward it on a router)")
    join.add_argument("--dht-announce", default=S, metavar="MULTIADDR",
                      help="address to tell peers instead of the listening one (a public address)")
    join.add_argument("--client-mode", action="store_true", default=S,
                      help="make outgoing DHT connections only (behind NAT; cannot serve state to others)")
    join.add_argument("--assume-public", action="store_true", default=S, help=argparse.SUPPRESS)  # benches only
    join.add_argument("--attack", default=S, choices=ATTACKS,
                      help="for benches and tests of robust aggregation only: this node sends corrupted updates")
    limits = join.add_argument_group("your limits")
    limits.add_argument("--max-cpus", type=int, default=S, help="use at most this many CPUs")
    limits.add_argument("--max-memory", default=S, help="leave cleanly when using more memory than this (e.g. 4G)")
    limits.add_argument("--max-upload-mbps", type=float, default=S, help="cap what this node sends, in Mbit/s")
    limits.add_argument("--only-when-idle", action="store_true", default=S,
                        help="pause training while other programs keep this machine busy")
    group = join.add_mutually_exclusive_group()
    group.add_argument("--ca", metavar="FILE", default=S, help="CA certificate that signed the coordinator's TLS "
                                                               "certificate (default: the system's roots)")
    group.add_argument("--insecure", action="store_true", default=S, help="plaintext gRPC, for loopback demos and tests")
    join.set_defaults(handler=cmd_join)


def resolve_options(args: argparse.Namespace) -> dict:
    """Command line over config file over defaults, each value checked; a bad one names its flag or key."""
    values = {}
    if args.config is not None:
        try:
            loaded = tomllib.loads(Path(args.config).read_text())
        except OSError as e:
            raise SystemExit(f"--config: cannot read {args.config}: {e.strerror or e}")
        except tomllib.TOMLDecodeError as e:
            raise SystemExit(f"--config: {args.config} is not valid TOML: {e}")
        loaded = loaded.get("node", loaded)
        for key, value in loaded.items():
            if key not in OPTIONS:
                raise SystemExit(f"--config: unknown key {key!r} in {args.config}")
            kind = OPTIONS[key][0]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise SystemExit(f"--config: {key} must be {kind.__name__}, got {value!r}")
            values[key] = value
    for key in OPTIONS:
        if hasattr(args, key):
            values[key] = getattr(args, key)
    out = {key: values.get(key, default) for key, (_, default) in OPTIONS.items()}
    if not out["coordinator"]:
        raise SystemExit("node join: give the coordinator's HOST:PORT (or `coordinator` in --config)")
    if not out["token"]:
        raise SystemExit("--token: required (or `token` in --config)")
    for key in ("max_steps", "max_rounds", "threads", "wait_peers", "max_cpus"):
        if out[key] < 0:
            raise SystemExit(f"--{key.replace('_', '-')}: must be >= 0")
    if not 0 <= out["dht_port"] <= 65535:
        raise SystemExit(f"--dht-port: must be in 0..65535, got {out['dht_port']}")
    for key in ("duration", "max_upload_mbps"):
        if out[key] < 0:
            raise SystemExit(f"--{key.replace('_', '-')}: must be >= 0")
    if out["attack"] and out["attack"] not in ATTACKS:
        raise SystemExit(f"--config: attack must be one of {', '.join(ATTACKS)}, got {out['attack']!r}")
    if out["ca"] and out["insecure"]:
        raise SystemExit("--ca and --insecure exclude each other")
    try:
        out["max_memory"] = parse_size(out["max_memory"]) if out["max_memory"] else 0
    except ValueError as e:
        raise SystemExit(str(e))
    out["name"] = out["name"] or socket.gethostname()
    return out


def cmd_join(args) -> int:
    from cotrain.node.runner import Node, NodeOptions  # torch and hivemind: only when a node really starts

    o = resolve_options(args)
    Node(NodeOptions(coordinator=o["coordinator"], token=o["token"], name=o["name"], insecure=o["insecure"],
                     ca=o["ca"], state_dir=Path(o["state_dir"]) if o["state_dir"] else None,
                     max_steps=o["max_steps"], max_rounds=o["max_rounds"], wait_peers=o["wait_peers"],
                     duration=o["duration"], threads=o["threads"], dht_host=o["dht_host"], dht_port=o["dht_port"],
                     dht_announce=(o["dht_announce"],) if o["dht_announce"] else (),
                     client_mode=o["client_mode"], assume_public=o["assume_public"], max_cpus=o["max_cpus"], max_memory=o["max_memory"],
                     max_upload_mbps=o["max_upload_mbps"], only_when_idle=o["only_when_idle"],
                     attack=o["attack"])).run()
    return 0
