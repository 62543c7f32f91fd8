"""A volunteer behind NAT in a swarm of three: round time, rounds, partial rounds and averaging bytes per node.

    sudo python bench/nat.py [--budget-s 90] [--scenarios auto client-mode assume-public public] [--json FILE]

Needs root and network namespaces (``ip netns``). Each scenario builds a fresh ``tests/netns.py`` lab: a public
namespace holding the public address 10.231.0.1 with the coordinator and two public nodes listening on it, and one
namespace behind a veth pair that can dial the public address but that nobody can dial into (no forwarding, the
node listens on its own loopback). The scenarios run one after another, each with the same model, data and time
budget (``--duration``), every node on one torch thread pinned to a core of its own where there are enough
(``taskset`` + ``--max-cpus 1``; on 2 cores two nodes share one):

- auto: the third node behind NAT with default flags: the coordinator cannot dial it when it registers its DHT
  peer, so it restarts its DHT in client mode by itself (``reachability`` "dial-out only");
- client-mode: the same node told so (``--client-mode``), no check;
- assume-public: the same node with ``--assume-public``: it skips the check and keeps announcing its unreachable
  loopback address (the behaviour before issue 15);
- public: the baseline, three public nodes (the third in the same namespace behind its link, but listening on its
  link address, which the public namespace reaches).

Per node: the reachability the coordinator reports, rounds completed (averaged with at least one peer), partial
rounds (some contribution left out), the averaging bytes it sent and received (its exchange's counters, state
downloads excluded), and the round time: seconds per completed round, from its first training step to the
completion of its last round, as the coordinator's health view showed them (``swarm status --watch``, sampled every
second, so each end is known to a second or a heartbeat). Everything this bench creates is removed at the end, on
errors and on Ctrl-C too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # the namespace helper the NAT tests use

import netns  # noqa: E402
from common import (Interrupted, Swarm, bench_parser, default_text, interruptible, lstm_config,  # noqa: E402
                    print_table, uninterrupted, work_folder, write_json)

from cotrain.config import RunConfig  # noqa: E402
from cotrain.cli.launch import Proc  # noqa: E402

SCENARIOS = {
    # name: (the third node's flags, whether it listens on its link address, what it shows)
    "auto": ([], False, "2 public + 1 NAT, auto-detected"),
    "client-mode": (["--client-mode"], False, "2 public + 1 NAT, --client-mode"),
    "assume-public": (["--assume-public"], False, "2 public + 1 NAT, --assume-public (old)"),
    "public": ([], True, "3 public (baseline)"),
    # two dial-out nodes must average through the public one (they reduce no part of the all-reduce)
    "two-nat": ([], False, "1 public + 2 NAT, auto-detected"),
}


def make_config(args) -> RunConfig:
    return lstm_config(
        "nat", args.data, args.hidden,
        optimizer={"lr": 3e-3},
        averaging={"inner_steps": args.H, "matchmaking_time": 2.0, "request_timeout": 1.5, "progress_interval": 1.0,
                   "allreduce_timeout": 20.0, "round_wait": 20.0},
        coordinator={"heartbeat_interval_s": 1.0, "checkpoint_interval_s": 30.0})


def read_frames(path: Path) -> list[dict]:
    """The JSON documents ``swarm status --watch --format json`` printed one after another."""
    text, frames, decoder, at = path.read_text(errors="replace"), [], json.JSONDecoder(), 0
    while True:
        start = text.find("{", at)
        if start < 0:
            return frames
        try:
            frame, at = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            return frames  # the last one was cut off when the watcher stopped
        frames.append(frame)


def round_time(frames: list[dict], name: str, completed: int) -> Optional[float]:
    """Seconds per completed round: from the first frame showing the node's first step to the first showing its
    final count of completed rounds."""
    rows = [(f["now_unix"], r["metrics"]) for f in frames for r in f["nodes"] if r["node_name"] == name]
    started = next((t for t, m in rows if m["step"] > 0), None)
    finished = next((t for t, m in rows if m["rounds_completed"] >= completed), None)
    if not completed or started is None or finished is None or finished <= started:
        return None
    return (finished - started) / completed


def run_scenario(args, name: str, cfg_path: Path, workdir: Path) -> dict:
    lab = netns.NatLab(nat=2 if name == "two-nat" else 1, rate_mbit=args.rate_mbit).setup()
    try:
        nodes, codes, procs, final = run_nodes(args, name, lab, cfg_path, workdir)
    finally:
        with uninterrupted():
            lab.teardown()
    rows = {r["node_name"]: r for r in json.loads(final.stdout)["nodes"]} if final.returncode == 0 else {}
    frames = read_frames(workdir / "watch.json")
    out = []
    for (node, _, _), proc, code in zip(nodes, procs, codes):
        row = rows.get(node)
        m = row["metrics"] if row else {}
        completed = int(m.get("rounds_completed", 0))
        out.append(dict(node=node, exit_code=code, reachability=row["reachability"] if row else None,
                        rounds=int(m.get("round", 0)), rounds_completed=completed,
                        partial_rounds=int(m.get("partial_rounds", 0)), bytes_sent=int(m.get("bytes_sent", 0)),
                        bytes_received=int(m.get("bytes_received", 0)),
                        state_bytes_received=int(m.get("state_bytes_received", 0)),
                        round_time_s=round_time(frames, node, completed),
                        log_tail=proc.log()[-1500:] if code != 0 else ""))
    return dict(nodes=out, bytes_sent_total=sum(n["bytes_sent"] for n in out),
                bytes_received_total=sum(n["bytes_received"] for n in out))


def run_nodes(args, name: str, lab: netns.NatLab, cfg_path: Path, workdir: Path):
    """The scenario's swarm in ``lab``, watched every second, until its nodes leave;
    -> (nodes, their exit codes, their processes, the final ``swarm status --format json``)."""
    flags, third_public, _ = SCENARIOS[name]
    pub = lab.prefix(lab.public)
    with Swarm(cfg_path, workdir, listen=f"{lab.public_ip}:0", prefix=pub, token_name="nat") as swarm:
        address = swarm.address
        watcher = swarm.add(Proc("watch", ["swarm", "status", address, "--insecure", "--format", "json", "--watch",
                                           "--interval", "1"], workdir / "watch.json", prefix=pub))
        cpus = sorted(os.sched_getaffinity(0))
        nodes = [("pub-0", lab.public, ["--dht-host", lab.public_ip]),
                 ("pub-1", lab.public, ["--dht-host", lab.public_ip]),
                 ("nat" if not third_public else "pub-2", lab.nats[0],
                  ["--dht-host", lab.nat_ip(0)] if third_public else flags)]
        if name == "two-nat":
            nodes = [nodes[0], ("nat-0", lab.nats[0], []), ("nat-1", lab.nats[1], [])]
        procs = []
        for i, (node, namespace, extra) in enumerate(nodes):
            pin = ["taskset", "-c", str(cpus[i % len(cpus)])]
            procs.append(swarm.start_node(node, ["--threads", "1", "--max-cpus", "1", "--wait-peers", str(len(nodes)),
                                                 "--duration", str(args.budget_s), *extra],
                                          prefix=[*lab.prefix(namespace), *pin]))
        # the nodes leave after --duration; one that failed (a flag this version lacks) would keep the others waiting
        # for their third peer, so the rest are stopped then, and at a deadline
        deadline = time.monotonic() + args.budget_s + 240
        while any(p.alive() for p in procs) and swarm.proc.alive() and time.monotonic() < deadline:
            if any(p.popen.poll() not in (None, 0) for p in procs):
                break
            time.sleep(1.0)
        codes = swarm.stop_nodes()
        final = subprocess.run([*pub, sys.executable, "-m", "cotrain.cli", "swarm", "status", address, "--insecure",
                                "--format", "json"], capture_output=True, text=True, timeout=120)
        watcher.stop(5)
    return nodes, codes, procs, final


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--budget-s", type=float, default=90.0, help="each node's --duration in every scenario")
    parser.add_argument("--hidden", type=int, default=128, help="LSTM hidden size (1 layer)")
    parser.add_argument("--H", type=int, default=20, help="local steps per DiLoCo round")
    parser.add_argument("--rate-mbit", type=float, default=0.0, help="limit every link each way (0: no limit)")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, state) for inspection")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    if args.budget_s <= 0:
        parser.error("--budget-s must be positive")
    args.data = args.data or default_text()
    reason = netns.unavailable()
    if reason:
        print(f"bench/nat.py needs network namespaces: {reason}", file=sys.stderr)
        return 2

    results: dict[str, dict] = {}
    try:
        with interruptible(), work_folder("cotrain-nat-", keep=args.keep) as workdir:
            cfg_path = workdir / "run.toml"
            cfg_path.write_text(make_config(args).to_toml())
            for name in args.scenarios:
                print(f"{name}: {SCENARIOS[name][2]}, {args.budget_s:g}s", flush=True)
                results[name] = run_scenario(args, name, cfg_path, workdir / name)
                for n in results[name]["nodes"]:
                    rt = f"{n['round_time_s']:.2f}s/round" if n["round_time_s"] else "-"
                    print(f"  {n['node']}: {n['reachability'] or '-'}, {n['rounds_completed']} rounds ({rt}), "
                          f"{n['partial_rounds']} partial, {n['bytes_sent']:,} bytes sent, exit {n['exit_code']}",
                          flush=True)
                    if n["exit_code"] != 0:
                        print("    " + n["log_tail"].strip().replace("\n", "\n    ")[-600:], flush=True)
    except Interrupted:
        return 130

    rows = []
    for name, r in results.items():
        for n in r["nodes"]:
            rows.append([name, n["node"], n["reachability"] or "-", n["rounds_completed"],
                         "-" if n["round_time_s"] is None else round(n["round_time_s"], 2), n["partial_rounds"],
                         n["bytes_sent"], n["bytes_received"], n["exit_code"]])
    print_table(f"NAT: 3 nodes, LSTM 1x{args.hidden}, H={args.H}, {args.budget_s:g}s each"
                + (f", links {args.rate_mbit:g} Mbit/s" if args.rate_mbit else ""),
                ["scenario", "node", "reachability", "rounds", "s/round", "partial", "bytes sent", "bytes recv",
                 "exit"], rows)
    write_json(args.json, dict(budget_s=args.budget_s, hidden=args.hidden, H=args.H, rate_mbit=args.rate_mbit,
                               scenarios=results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
