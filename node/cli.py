"""``cotrain node ...``: the volunteer's commands."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from cotrain.node.runner import Node, NodeOptions


def add_tls_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--ca", metavar="FILE", help="CA certificate that signed the coordinator's TLS certificate "
                                                    "(default: the system's roots)")
    group.add_argument("--insecure", action="store_true", help="plaintext gRPC, for loopback demos and tests")


def add_parser(subparsers) -> None:
    node = subparsers.add_parser("node", help="run a volunteer node").add_subparsers(dest="node_command",
                                                                                    metavar="COMMAND", required=True)
    join = node.add_parser("join", help="join a coordinator's run and train until stopped")
    join.add_argument("coordinator", metavar="COORDINATOR", help="the coordinator's HOST:PORT")
    join.add_argument("--token", required=True, help="join token the operator gave you")
    join.add_argument("--name", default=socket.gethostname(), help="name shown on the dashboard (default: hostname)")
    join.add_argument("--state-dir", type=Path, default=None,
                      help="keeps this node's identity, so a restart resumes as the same node")
    join.add_argument("--max-steps", type=int, default=0, help="leave after this many local steps (0: never)")
    join.add_argument("--max-rounds", type=int, default=0, help="leave after this many averaging rounds (0: never)")
    join.add_argument("--duration", type=float, default=0.0, help="leave after this many seconds (0: never)")
    join.add_argument("--threads", type=int, default=0, help="torch threads for training (0: torch's default)")
    join.add_argument("--wait-peers", type=int, default=0,
                      help="before training, wait (up to 5 minutes) until this many peers are in the swarm")
    join.add_argument("--dht-host", default="127.0.0.1", help="address the DHT peer listens on (default 127.0.0.1)")
    join.add_argument("--client-mode", action="store_true",
                      help="make outgoing DHT connections only (behind NAT; cannot serve state to others)")
    add_tls_flags(join)
    join.set_defaults(handler=cmd_join)


def cmd_join(args) -> int:
    for flag in ("max_steps", "max_rounds", "threads", "wait_peers"):
        if getattr(args, flag) < 0:
            raise SystemExit(f"--{flag.replace('_', '-')}: must be >= 0")
    if args.duration < 0:
        raise SystemExit("--duration: must be >= 0")
    Node(NodeOptions(coordinator=args.coordinator, token=args.token, name=args.name, insecure=args.insecure,
                     ca=args.ca, state_dir=args.state_dir, max_steps=args.max_steps,
                     max_rounds=args.max_rounds, wait_peers=args.wait_peers, duration=args.duration,
                     threads=args.threads, dht_host=args.dht_host, client_mode=args.client_mode)).run()
    return 0
