"""``cotrain simulate``: try a run config on a whole virtual swarm before inviting volunteers.

A coordinator starts on this machine with ``--managed-nodes N``: N nodes run as Ray actors with fractional CPUs
(a local Ray instance, or the operator's cluster with ``--ray-address``), join over gRPC like volunteers, and train
together through hivemind. The command shows the swarm's status while it runs and a summary at the end (rounds,
samples, the latest validation figures, bytes on the wire per node, alerts). Each node is a full process (torch and
hivemind): a fleet estimated not to fit this machine's memory is refused before anything starts
(:mod:`cotrain.sizing`; ``--force`` starts it anyway).

``--virtual N`` models a larger swarm instead: N virtual peers of a pure-Python round model (no training, no
network; :mod:`cotrain.averaging.simulation`) deciding with the node's own round functions under the config's
averaging settings, and reports how groups formed and what the progress board costs a node by a DHT traffic model:
what ``averaging.board_shards`` buys at hundreds of peers.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from pathlib import Path

from cotrain.config import RunConfig


def add_parser(subparsers) -> None:
    sim = subparsers.add_parser("simulate", help="run a virtual swarm of N nodes as Ray actors to try a run config",
                                description=__doc__)
    sim.add_argument("--nodes", type=int, default=8, help="virtual nodes (Ray actors)")
    sim.add_argument("--virtual", type=int, default=0, metavar="N",
                     help="model N virtual peers (no training, no Ray) over --duration seconds of swarm time")
    sim.add_argument("--config", type=Path, default=None, help="run config (TOML); default: built-in defaults")
    sim.add_argument("--duration", type=float, default=120.0, help="seconds of training once the nodes run")
    sim.add_argument("--rounds", type=int, default=0, metavar="R",
                     help="end as soon as the swarm has reached round R (within --duration; default: run for "
                          "--duration)")
    sim.add_argument("--cpus-per-node", type=float, default=0.0,
                     help="CPUs reserved per node, and its torch threads (default: the CPUs this process may "
                          "use / --nodes)")
    sim.add_argument("--cpu-limit", action="store_true",
                     help="enforce each node's CPUs (node join --cpu-limit: a cgroup quota, needs root), where Ray "
                          "only reserves them: as if each node had a machine of that size")
    sim.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: a local instance)")
    sim.add_argument("--workdir", type=Path, default=None, help="keep state, checkpoints and logs here "
                                                                "(default: a temporary folder, removed after)")
    sim.add_argument("--format", choices=("table", "json"), default="table", help="the final summary's format")
    sim.add_argument("--force", action="store_true",
                     help="start even where the nodes are estimated not to fit this machine's memory")
    sim.set_defaults(handler=cmd_simulate, launcher=True)


def cmd_simulate(args) -> int:
    if args.nodes < 1:
        raise SystemExit(f"--nodes: must be >= 1, got {args.nodes}")
    if not args.duration > 0:
        raise SystemExit(f"--duration: must be > 0, got {args.duration}")
    if args.rounds < 0:
        raise SystemExit(f"--rounds: must be >= 0, got {args.rounds}")
    if args.cpus_per_node < 0:
        raise SystemExit(f"--cpus-per-node: must be > 0, got {args.cpus_per_node}")
    cfg = RunConfig.load(args.config) if args.config else RunConfig()
    if args.virtual:
        return virtual_swarm(args, cfg)

    from rich.console import Console

    from cotrain.cli.launch import LaunchError, last_words, machine_cpus, start_coordinator, wait_for
    from cotrain.coordinator.fleet import ray_share
    from cotrain.sizing import check_fleet

    if not args.ray_address:  # a cluster's memory is the coordinator's to check, once it is connected
        check_fleet("--nodes", args.nodes, cfg, args.force)

    # the nodes divide the CPUs (its affinity, its cgroup's quota) rather than the machine's cores: each takes
    # floor(cpus) torch threads, at least one (the fleet's --threads); a share as Ray reserves it (in 1/10000s,
    # rounded down: 3 nodes on 2 CPUs reserve 0.6666 each, which fit, not 0.666667, which would not)
    cpus = args.cpus_per_node or ray_share(max(0.01, machine_cpus() / args.nodes))
    from cotrain.client import CoordinatorClient
    from cotrain.status import health_table, message_to_dict

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="cotrain-simulate-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "run.toml").write_text(cfg.to_toml())
    console = Console(stderr=True)
    console.print(f"simulating {args.nodes} node(s) at {cpus:.2f} CPU each for {args.duration:.0f}s in {workdir}")
    extra = ["--managed-nodes", str(args.nodes), "--managed-node-cpus", f"{cpus:g}",
             *(["--managed-node-cpu-limit"] if args.cpu_limit else []), *(["--force"] if args.force else [])]
    if args.ray_address:
        extra += ["--ray-address", args.ray_address]
    coordinator, address = start_coordinator(workdir / "coordinator", workdir / "run.toml", extra=extra,
                                             timeout=300.0)
    client = CoordinatorClient(address, insecure=True, rpc_timeout=10.0)
    try:
        up = [-1]

        def joined() -> bool:  # says how many are up whenever it changes: never minutes of silence
            count = sum(n.state == "healthy" for n in client.health().nodes)
            if count != up[0]:
                up[0] = count
                console.print(f"{count} of {args.nodes} nodes up")
            return count >= args.nodes

        try:
            wait_for(joined, 600.0, interval=2.0, what=f"{args.nodes} nodes to join", procs=[coordinator])
        except LaunchError as e:  # cotrain prints its first line and where the logs are
            raise LaunchError(f"simulate: {e}", logs=[workdir], exit_code=e.exit_code) from None
        started = shown = time.monotonic()
        health = client.health()
        # with --rounds: look every second whether the swarm got there; show the status every 10 s either way
        while time.monotonic() - started < args.duration and not (
                args.rounds and health.totals.global_round >= args.rounds):
            time.sleep(min(1.0 if args.rounds else 10.0, args.duration - (time.monotonic() - started)))
            if not coordinator.alive():
                code = coordinator.popen.returncode
                raise LaunchError(f"simulate: the coordinator exited with code {code}: {last_words(coordinator.log())}",
                                  logs=[workdir], exit_code=code)
            health = client.health()
            if time.monotonic() - shown >= 10.0:
                shown = time.monotonic()
                console.print(health_table(health))
        trained_s = time.monotonic() - started
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: the managed nodes and Ray go with the coordinator
        client.close()
        coordinator.stop(30)
        console.print(f"stopped the coordinator (pid {coordinator.pid}), its {args.nodes} managed node(s) and its "
                      f"Ray instance")
        raise
    finally:
        client.close()
        code = coordinator.stop(120)
    t = health.totals
    summary = dict(nodes=args.nodes, cpus_per_node=cpus, duration_s=round(trained_s, 1),
                   stopped_by="rounds" if args.rounds and t.global_round >= args.rounds else "duration",
                   global_round=t.global_round,
                   samples_total=t.samples_total, val_loss=None if math.isnan(t.val_loss) else t.val_loss,
                   val_bpc=None if math.isnan(t.val_bpc) else t.val_bpc, val_round=t.val_round,
                   bytes_sent_per_node=t.bytes_sent / max(1, len(health.nodes)), alerts=list(health.alerts),
                   epoch=t.epoch, units_done=t.units_done, units_reissued=t.units_reissued,
                   coordinator_exit_code=code, nodes_detail=[message_to_dict(n) for n in health.nodes])
    if args.format == "json":
        print(json.dumps(summary, indent=1))
    else:
        console.print(health_table(health))
        print(f"simulated {args.nodes} nodes for {summary['duration_s']:.0f}s: global round {t.global_round}, "
              f"{t.samples_total} samples, validation "
              + (f"{t.val_bpc:.3f} BPC" if not math.isnan(t.val_bpc) else
                 f"loss {t.val_loss:.4f}" if not math.isnan(t.val_loss) else "not yet")
              + f" (round {t.val_round}), {summary['bytes_sent_per_node'] / 1e6:.1f} MB sent per node")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if code == 0 else 1


def virtual_swarm(args, cfg: RunConfig) -> int:
    from dataclasses import asdict

    from cotrain.averaging.simulation import SimConfig, simulate

    if not 2 <= args.virtual <= 100_000:
        raise SystemExit(f"--virtual: must be in [2, 100000], got {args.virtual}")
    a = cfg.averaging
    result = simulate(SimConfig(peers=args.virtual, shards=a.board_shards, group=a.target_group_size,
                                inner_steps=a.inner_steps, progress_interval=a.progress_interval,
                                round_wait=a.round_wait, matchmaking_time=a.matchmaking_time,
                                duration_s=args.duration))
    if args.format == "json":
        print(json.dumps(asdict(result), indent=1))
        return 0
    print(f"{result.peers} virtual peers, board in {result.shards} shard(s), {args.duration:g}s of swarm time: "
          f"{result.rounds_per_min:.1f} rounds a minute a peer, {result.groups} groups of {result.group_size:.1f} "
          f"on average, {result.failed_meetings} meetings that did not fill, {result.resyncs} resyncs, "
          f"{result.alone} rounds alone; a board read {result.records_per_read:.0f} records, "
          f"{result.dht_bytes_per_node_min / 1e6:.2f} MB of DHT traffic a node a minute "
          f"(busiest replica {result.busiest_node_bytes_min / 1e6:.1f} MB a minute)")
    return 0
