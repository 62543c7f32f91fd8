"""``cotrain coordinator ...``: the operator's commands."""

from __future__ import annotations

import asyncio
import logging
import json
import sys
import time
from pathlib import Path

from cotrain.config import RunConfig
from cotrain.memory import limit_malloc_arenas, trace_allocations_from_env
from cotrain.exit_codes import ExitCode

from cotrain.coordinator.store import Store, TokenExists


def add_parser(subparsers) -> None:
    coordinator = subparsers.add_parser("coordinator", help="run and administer a coordinator").add_subparsers(
        dest="coordinator_command", metavar="COMMAND", required=True)

    start = coordinator.add_parser("start", help="start the coordinator of a run")
    start.add_argument("--config", type=Path, help="run config (TOML); default: built-in defaults")
    start.add_argument("--listen", default="127.0.0.1:7450", help="gRPC address HOST:PORT (default 127.0.0.1:7450)")
    start.add_argument("--state-dir", type=Path, default=Path("cotrain-state"),
                       help="SQLite state, checkpoints and DHT identity (default ./cotrain-state)")
    warm = start.add_argument_group("warm start (a new run from an old run's checkpoint)")
    warm.add_argument("--warm-start", metavar="CHECKPOINT", help="start the run from this checkpoint")
    warm.add_argument("--shrink", type=float, default=None, help="lambda of shrink and perturb (default 0.6)")
    warm.add_argument("--perturb", type=float, default=None, help="sigma of shrink and perturb (default 0.01)")
    start.add_argument("--http-port", type=int, default=None,
                       help="serve the dashboard and Prometheus /metrics on this port (0: any free port)")
    start.add_argument("--dht-announce", action="append", default=[], metavar="MULTIADDR",
                       help="address to give nodes for the DHT instead of the listening one, e.g. "
                            "/ip4/203.0.113.5/tcp/7452 (repeatable)")
    start.add_argument("--dht-port", type=int, default=0, help="TCP port of the DHT bootstrap peer (0: any free)")
    ray = start.add_argument_group("the operator's fleet (Ray; volunteers never join it)")
    ray.add_argument("--ray-address", default=None, metavar="auto|ADDRESS",
                     help="Ray cluster for managed nodes and evaluation tasks (default: a local Ray instance when "
                          "--managed-nodes is given, else no Ray: evaluations run on the coordinator)")
    ray.add_argument("--managed-nodes", type=int, default=0, metavar="N", help="run N nodes as Ray actors")
    ray.add_argument("--managed-node-cpus", type=float, default=1.0, metavar="CPUS",
                     help="CPUs reserved per managed node (fractions allowed, in Ray's steps of 0.0001; a local Ray "
                          "instance gets the whole CPUs they add up to, plus one for evaluations, and refuses a node "
                          "larger than this machine; a --ray-address cluster must hold them all)")
    ray.add_argument("--managed-node-cpu-limit", action="store_true",
                     help="enforce --managed-node-cpus too, not only reserve it: each node runs with --cpu-limit "
                          "(a cgroup quota on the machine it runs on; needs root there)")
    ray.add_argument("--force", action="store_true",
                     help="start the managed nodes even where they are estimated not to fit a local Ray instance's "
                          "memory (this machine's)")
    tls = start.add_argument_group("TLS (required unless --insecure)")
    tls.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    tls.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    tls.add_argument("--insecure", action="store_true", help="plaintext gRPC, for loopback demos and tests")
    start.set_defaults(handler=cmd_start)

    token = coordinator.add_parser("token", help="create, list and revoke join tokens").add_subparsers(
        dest="token_command", metavar="COMMAND", required=True)
    create = token.add_parser("create", help="create a join token and print it")
    create.add_argument("name", help="who the token is for (unique)")
    create.add_argument("--expires-in", type=float, default=0.0, help="seconds until it expires (0: never)")
    create.add_argument("--max-nodes", type=int, default=0,
                        help="most nodes online at once with this token (0: no limit); one volunteer, one node: 1")
    revoke = token.add_parser("revoke", help="revoke a token: its nodes can no longer join, their data-plane "
                                             "credentials are revoked at once (a running coordinator applies it "
                                             "within a second)")
    revoke.add_argument("name")
    listing = token.add_parser("list", help="list tokens (never their secrets)")
    listing.add_argument("--format", choices=("table", "json"), default="table")
    for p in (create, revoke, listing):
        p.add_argument("--state-dir", type=Path, default=Path("cotrain-state"), help="the coordinator's state dir")
    create.set_defaults(handler=cmd_token_create)
    revoke.set_defaults(handler=cmd_token_revoke)
    listing.set_defaults(handler=cmd_token_list)


def cmd_start(args) -> int:
    if not args.insecure and not (args.tls_cert and args.tls_key):
        raise SystemExit("coordinator start: pass --tls-cert and --tls-key, or --insecure for plaintext")
    for flag, port in (("--dht-port", args.dht_port), ("--http-port", args.http_port)):
        if port is not None and not 0 <= port <= 65535:
            raise SystemExit(f"{flag}: must be in 0..65535, got {port}")
    if args.managed_nodes < 0:
        raise SystemExit(f"--managed-nodes: must be >= 0, got {args.managed_nodes}")
    if not args.managed_node_cpus > 0:
        raise SystemExit(f"--managed-node-cpus: must be > 0, got {args.managed_node_cpus}")
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path is not None and not path.is_file():
            raise SystemExit(f"{flag}: no such file {path}")
    from cotrain.coordinator.server import CoordinatorOptions, serve  # torch and hivemind: only to serve

    cfg = RunConfig.load(args.config) if args.config else None
    if args.warm_start or args.shrink is not None or args.perturb is not None:
        if not args.warm_start and not (cfg and cfg.warm_start.checkpoint):
            raise SystemExit("--shrink/--perturb: pass --warm-start CHECKPOINT too")
        values = {k: v for k, v in (("checkpoint", args.warm_start), ("shrink", args.shrink),
                                    ("perturb", args.perturb)) if v is not None}
        cfg = (cfg or RunConfig()).with_overrides(warm_start=values)
    options = CoordinatorOptions(listen=args.listen, state_dir=args.state_dir, dht_port=args.dht_port,
                                 insecure=args.insecure, tls_cert=args.tls_cert, tls_key=args.tls_key,
                                 http_port=args.http_port, dht_announce=tuple(args.dht_announce),
                                 ray_address=args.ray_address, managed_nodes=args.managed_nodes,
                                 managed_node_cpus=args.managed_node_cpus,
                                 managed_node_cpu_limit=args.managed_node_cpu_limit, force=args.force)
    logging.getLogger(__name__).info(limit_malloc_arenas())  # before gRPC's, hivemind's and the checkpointer's threads allocate
    tracing = trace_allocations_from_env("coordinator")  # COTRAIN_TRACEMALLOC: bench/soak.py --tracemalloc
    if tracing:
        logging.getLogger(__name__).info(tracing)
    asyncio.run(serve(cfg, options))
    return 0


def cmd_token_create(args) -> int:
    if args.expires_in < 0:
        raise SystemExit("--expires-in: must be >= 0")
    if args.max_nodes < 0:
        raise SystemExit("--max-nodes: must be >= 0")
    expires = time.time() + args.expires_in if args.expires_in else None
    try:
        token = Store(args.state_dir).create_token(args.name, expires, args.max_nodes or None)
    except TokenExists as e:
        print(f"cotrain: token create: {args.state_dir} already holds a token named {e.name!r} (a revoked token "
              f"keeps its name); pick another name", file=sys.stderr)
        return ExitCode.STATE
    print(token)
    return 0


def cmd_token_revoke(args) -> int:
    if not Store(args.state_dir).revoke_token(args.name):
        raise SystemExit(f"token revoke: no token named {args.name!r} in {args.state_dir}")
    print(f"revoked {args.name}")
    return 0


def cmd_token_list(args) -> int:
    now = time.time()
    rows = [dict(name=t.name, created=t.created, expires=t.expires, revoked=t.revoked, usable=t.usable(now)[0],
                 max_nodes=t.max_nodes)
            for t in Store(args.state_dir).list_tokens()]
    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'NAME':24} {'CREATED':20} {'EXPIRES':20} STATE")
        for r in rows:
            fmt = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "never"
            state = "revoked" if r["revoked"] else ("usable" if r["usable"] else "expired")
            print(f"{r['name']:24} {fmt(r['created']):20} {fmt(r['expires']):20} {state}")
    return 0
