"""Time to a target validation loss over slow links: a cotrain swarm (DiLoCo, int8) against data-parallel training.

    sudo python bench/wan.py [--nodes 3] [--rate-mbit 50] [--budget-s 300] [--target-val-loss 2.0] [--json FILE]

Needs root and network namespaces (``ip netns``, ``tc`` with the tbf qdisc). It builds a small WAN on this machine:
a bridge ``ctwan-br`` holding the hub address 10.250.0.1/24, and one namespace per worker (``cotrain-wan-0`` ..)
joined to the bridge by a veth pair, worker i at 10.250.0.(10 + i). Both ends of every worker link are limited to
``--rate-mbit`` with a token bucket (``tc qdisc ... root tbf rate R burst 32kbit latency 400ms``), so a worker's
upload and download are each capped, and traffic between two workers crosses two limited links, as between two
homes on the internet. No latency is added (netem is not needed). Everything is removed at the end, on errors and
on Ctrl-C too.

Both sides train the same byte-level LSTM (default 1 x 128) on tinyshakespeare with the same per-worker batch,
AdamW and data shards, one torch thread per worker, until the validation loss (nats per byte on the first
``--eval-bytes`` of the validation split) reaches the target or the time budget runs out:

- cotrain: a coordinator on the hub address, one ``cotrain node join`` per namespace (its DHT peer on the worker's
  address), DiLoCo with ``--H`` local steps per round and int8-compressed pseudo-gradients. The coordinator fetches
  and evaluates the shared model every ``--checkpoint-interval-s`` seconds when a round has finished; the time to
  target is that of the first evaluation at or below the target (its resolution is a round plus that interval).
- ddp: one ``bench/ddp_worker.py`` rank per namespace, torch.distributed with gloo over the limited links,
  DistributedDataParallel (gradients averaged every step); rank 0 evaluates every ``--ddp-eval-every`` steps
  (its evaluation time is left out of its clock).

Times run from the launch of the workers (process start, rendezvous and DHT bootstrap included). Bytes per node:
for cotrain the bytes each node counted sending on its exchange (``bytes_sent``: the all-reduce, and the state it
served to joining peers and to the coordinator's checkpointer, one download of parameters and outer momentum in
fp32 per evaluation, so a short ``--checkpoint-interval-s`` adds to it); for ddp the bytes sent on the worker's
interface. The interface count of the cotrain nodes is reported as well: it adds the DHT, libp2p, heartbeats and
data requests. The target of 2.0 nats per byte is reached by both sides of the default set-up in about 50 s
(cotrain) and 90 s (ddp) on a loaded 2-core machine, well within the budget. The machine's cores are shared by all
workers, so absolute times depend on its load; compare the two sides of one run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (BENCH_OPTIMIZER, Interrupted, Swarm, bench_parser, default_text, interruptible,  # noqa: E402
                    lstm_config, print_table, stop_all, stopped_on_exit, uninterrupted, work_folder, write_json)

from cotrain.config import RunConfig  # noqa: E402
from cotrain.coordinator.store import read_evals  # noqa: E402

HERE = Path(__file__).resolve().parent
NS_PREFIX = "cotrain-wan-"
BRIDGE = "ctwan-br"
SUBNET = "10.250.0"
HUB_IP = f"{SUBNET}.1"
DDP_PORT = 29517


class NeedsRoot(Exception):
    """The machine cannot build the namespaces: not root, or no ``ip netns`` / ``tc``."""


class BuildFailed(Exception):
    """Building the namespaces failed (what was built of them is removed)."""


def worker_ip(i: int) -> str:
    return f"{SUBNET}.{10 + i}"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


# ---- the network ---------------------------------------------------------------------------------------------------
class Wan:
    """The bridge, namespaces and limited veth pairs. ``teardown`` removes whatever of them exists. As a context
    manager: built when the block starts (:class:`BuildFailed` if that fails), removed when it ends."""

    def __init__(self, nodes: int, rate_mbit: float):
        self.nodes, self.rate = nodes, rate_mbit

    def __enter__(self) -> "Wan":
        try:
            self.setup()
        except BaseException as e:  # a failed command, or Ctrl-C while building: remove what was built
            with uninterrupted():
                self.teardown()
            if isinstance(e, RuntimeError):
                raise BuildFailed(str(e)) from e
            raise
        return self

    def __exit__(self, *exc) -> None:
        with uninterrupted():
            self.teardown()

    @staticmethod
    def check() -> None:
        if os.geteuid() != 0:
            raise NeedsRoot("not running as root")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise NeedsRoot(f"`{tool}` (iproute2) is not installed")
        for cmd in (("ip", "netns", "list"), ("tc", "qdisc", "show")):
            result = sh(*cmd, check=False)
            if result.returncode != 0:
                raise NeedsRoot(f"`{' '.join(cmd)}` failed: {result.stderr.strip()}")

    @staticmethod
    def namespace(i: int) -> str:
        return f"{NS_PREFIX}{i}"

    @staticmethod
    def hub_if(i: int) -> str:
        return f"ctwan-h{i}"

    @staticmethod
    def worker_if(i: int) -> str:
        return f"ctwan-w{i}"

    def limit(self, dev: str, ns: Optional[str] = None) -> None:
        prefix = ("ip", "netns", "exec", ns) if ns else ()
        sh(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{self.rate:g}mbit",
           "burst", "32kbit", "latency", "400ms")

    def setup(self) -> None:
        self.teardown(quiet=False)  # leftovers of an interrupted run
        taken = [line for line in sh("ip", "-4", "-o", "addr", "show").stdout.splitlines()
                 if f" {SUBNET}." in line]
        if taken:
            raise RuntimeError(f"{SUBNET}.0/24 is already in use on this machine: {taken[0]}")
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{HUB_IP}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for i in range(self.nodes):
            ns, hub, wk = self.namespace(i), self.hub_if(i), self.worker_if(i)
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", hub, "type", "veth", "peer", "name", wk)
            sh("ip", "link", "set", wk, "netns", ns)
            sh("ip", "link", "set", hub, "master", BRIDGE)
            sh("ip", "link", "set", hub, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{worker_ip(i)}/24", "dev", wk)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", wk, "up")
            self.limit(hub)  # hub -> worker: the worker's download
            self.limit(wk, ns)  # worker -> hub and other workers: its upload
        self.check_reachable()

    def check_reachable(self) -> None:
        """Every namespace can open a TCP connection to the hub address."""
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((HUB_IP, 0))
        server.listen(self.nodes)
        port = server.getsockname()[1]
        probe = f"import socket; socket.create_connection(('{HUB_IP}', {port}), timeout=10).close()"
        try:
            for i in range(self.nodes):
                sh("ip", "netns", "exec", self.namespace(i), sys.executable, "-c", probe)
        finally:
            server.close()

    def teardown(self, quiet: bool = True) -> None:
        existing = set(sh("ip", "netns", "list", check=False).stdout.split())
        ours = sorted(n for n in existing if n.startswith(NS_PREFIX))
        if ours and not quiet:
            print(f"removing leftovers of an earlier run: {' '.join(ours)}", flush=True)
        for ns in ours:
            sh("ip", "netns", "del", ns, check=False)  # also removes the veth pairs with an end inside
        links = sh("ip", "-o", "link", "show", check=False).stdout
        for line in links.splitlines():
            name = line.split(":", 2)[1].strip().split("@")[0] if line.count(":") >= 2 else ""
            if name.startswith("ctwan-h") or name == BRIDGE:
                sh("ip", "link", "del", name, check=False)

    def tx_bytes(self, i: int) -> int:
        result = sh("ip", "netns", "exec", self.namespace(i), "cat",
                    f"/sys/class/net/{self.worker_if(i)}/statistics/tx_bytes")
        return int(result.stdout.strip())


# ---- processes -------------------------------------------------------------------------------------------------------
class NsProc:
    """A command in a namespace (or this one), in its own process group, logged to a file: for commands other than
    ``cotrain`` (which :class:`cotrain.cli.launch.Proc` runs); stopped like one (``signal``, ``stop``)."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, namespace: Optional[str] = None,
                 env: Optional[dict] = None):
        self.name, self.log_path = name, log_path
        self._log = open(log_path, "ab")
        prefix = ["ip", "netns", "exec", namespace] if namespace else []
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.popen = subprocess.Popen([*prefix, *argv], stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL what is left of its process group."""
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = self.popen.wait()
        if not self._log.closed:
            self._log.close()
        return code

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


# ---- the two sides ---------------------------------------------------------------------------------------------------
def make_config(args) -> RunConfig:
    return lstm_config(
        "wan", args.data, args.hidden, embed_dim=64, layers=args.layers, seq_len=args.seq_len,
        batch_size=args.batch_size,
        optimizer=BENCH_OPTIMIZER,
        schedule={"kind": "constant", "warmup_samples": 0},  # a constant lr (bench/ddp_worker.py reads it too)
        averaging={"strategy": "diloco", "inner_steps": args.H, "outer_lr": args.outer_lr,
                   "matchmaking_time": 3.0, "request_timeout": 2.0, "progress_interval": 1.0,
                   "target_group_size": args.nodes, "round_wait": 30.0, "allreduce_timeout": 60.0},
        compression={"kind": "int8"},
        coordinator={"checkpoint_interval_s": args.checkpoint_interval_s, "eval_bytes": args.eval_bytes})


def run_cotrain(args, wan: Wan, workdir: Path) -> dict:
    with Swarm(workdir / "run.toml", workdir, listen=f"{HUB_IP}:0", token_name="wan") as swarm:
        print(f"cotrain: coordinator at {swarm.address}", flush=True)
        tx0 = [wan.tx_bytes(i) for i in range(args.nodes)]
        t0 = time.time()
        nodes = [swarm.start_node(f"wan-{i}", ["--dht-host", worker_ip(i), "--threads", "1", "--wait-peers",
                                               str(args.nodes), "--duration", str(args.budget_s)],
                                  prefix=["ip", "netns", "exec", wan.namespace(i)]) for i in range(args.nodes)]
        reached, last_print = None, 0.0
        while time.time() - t0 < args.budget_s:
            evals = read_evals(swarm.state_dir)
            hit = [e for e in evals if e.val_loss <= args.target_val_loss]
            if hit:
                reached = hit[0].time - t0
                break
            if not any(n.alive() for n in nodes):
                break
            if evals and time.time() - last_print >= 15:
                last_print = time.time()
                print(f"  cotrain {time.time() - t0:5.0f}s round {evals[-1].round} val_loss {evals[-1].val_loss:.4f}",
                      flush=True)
            time.sleep(1.0)
        wall = time.time() - t0
        codes = swarm.stop_nodes()
        evals = read_evals(swarm.state_dir)
        rows = swarm.node_rows()
        tx1 = [wan.tx_bytes(i) for i in range(args.nodes)]
    sent = [int(r.get("bytes_sent", 0)) for r in rows]
    iface = [b - a for a, b in zip(tx0, tx1)]
    if any(c not in (0, -signal.SIGTERM) for c in codes):
        print(f"  warning: node exit codes {codes}; logs in {workdir}", flush=True)
    return dict(time_to_target_s=reached, bytes_per_node=sum(sent) / max(1, len(sent)),
                iface_tx_bytes_per_node=sum(iface) / len(iface), bytes_sent=sent, iface_tx_bytes=iface,
                final_val_loss=evals[-1].val_loss if evals else None, wall_s=wall,
                rounds=max((int(r.get("round", 0)) for r in rows), default=0), coordinator_state_downloads=len(evals),
                steps=[int(r.get("step", 0)) for r in rows],
                evals=[dict(elapsed_s=e.time - t0, round=e.round, val_loss=e.val_loss) for e in evals])


def start_ranks(args, wan: Wan, workdir: Path, t0: float, out: Path, ranks: list) -> None:
    """One ``ddp_worker.py`` rank per namespace, each put in ``ranks`` as soon as it runs."""
    for i in range(args.nodes):
        argv = [sys.executable, str(HERE / "ddp_worker.py"), "--config", str(workdir / "run.toml"), "--rank", str(i),
                "--world-size", str(args.nodes), "--master", f"{worker_ip(0)}:{DDP_PORT}", "--t0", repr(t0),
                "--budget-s", str(args.budget_s), "--target-val-loss", str(args.target_val_loss),
                "--eval-every", str(args.ddp_eval_every), "--out", str(out)]
        # gloo must use the limited link, not the address the host name resolves to
        ranks.append(NsProc(f"ddp-{i}", argv, workdir / f"ddp-{i}.log", wan.namespace(i),
                            env={"GLOO_SOCKET_IFNAME": wan.worker_if(i)}))


def run_ddp(args, wan: Wan, workdir: Path) -> dict:
    out = workdir / "ddp-evals.jsonl"
    tx0 = [wan.tx_bytes(i) for i in range(args.nodes)]
    t0 = time.time()
    with stopped_on_exit(timeout=10) as ranks:
        start_ranks(args, wan, workdir, t0, out, ranks)
        # the ranks stop themselves at the target or the budget; allow for rendezvous and one last interval
        deadline, last_print = t0 + args.budget_s + 120, time.time()
        while time.time() < deadline and any(p.alive() for p in ranks):
            if any(p.popen.poll() not in (None, 0) for p in ranks):
                break
            if time.time() - last_print >= 15 and out.exists():
                last_print = time.time()
                lines = out.read_text().splitlines()
                if lines:
                    e = json.loads(lines[-1])
                    print(f"  ddp {time.time() - t0:5.0f}s step {e['step']} val_loss {e['val_loss']:.4f}", flush=True)
            time.sleep(1.0)
        wall = time.time() - t0
        codes = stop_all(ranks, timeout=10)
        tx1 = [wan.tx_bytes(i) for i in range(args.nodes)]
    if any(codes):
        failed = next(p for p, c in zip(ranks, codes) if c)
        print(f"  warning: ddp exit codes {codes}; last lines of {failed.name}:\n{failed.tail()}", flush=True)
    evals = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    # rank 0 checks the budget only when it evaluates, so the last evaluation may come up to one interval late
    in_budget = [e for e in evals if e["elapsed_s"] <= args.budget_s]
    hit = [e for e in in_budget if e["val_loss"] <= args.target_val_loss]
    iface = [b - a for a, b in zip(tx0, tx1)]
    return dict(time_to_target_s=hit[0]["elapsed_s"] if hit else None, bytes_per_node=sum(iface) / len(iface),
                iface_tx_bytes_per_node=sum(iface) / len(iface), iface_tx_bytes=iface,
                final_val_loss=in_budget[-1]["val_loss"] if in_budget else None, wall_s=wall,
                steps=in_budget[-1]["step"] if in_budget else 0,
                evals=[{k: e[k] for k in ("elapsed_s", "step", "val_loss")} for e in evals])


# ---- main ------------------------------------------------------------------------------------------------------------
def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--nodes", type=int, default=3, help="workers on each side (one namespace each)")
    parser.add_argument("--rate-mbit", type=float, default=50.0, help="limit of each direction of each link")
    parser.add_argument("--budget-s", type=float, default=300.0, help="time budget of each side")
    parser.add_argument("--target-val-loss", type=float, default=2.0, help="nats per byte")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--H", type=int, default=50, help="cotrain: local steps per DiLoCo round")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--eval-bytes", type=int, default=32768, help="validation bytes per evaluation")
    parser.add_argument("--checkpoint-interval-s", type=float, default=5.0, help="cotrain: seconds between evaluations")
    parser.add_argument("--ddp-eval-every", type=int, default=25, help="ddp: steps between evaluations")
    parser.add_argument("--sides", nargs="+", default=["cotrain", "ddp"], choices=["cotrain", "ddp"])
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, state) for inspection")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    if not 1 <= args.nodes <= 200:
        parser.error("--nodes must be between 1 and 200")
    if args.rate_mbit <= 0 or args.budget_s <= 0:
        parser.error("--rate-mbit and --budget-s must be positive")
    args.data = args.data or default_text()

    try:
        Wan.check()
    except NeedsRoot as e:
        print(f"bench/wan.py needs root and network namespaces (ip netns, tc with tbf): {e}", file=sys.stderr)
        return 2

    results: dict[str, dict] = {}
    try:
        with interruptible(), Wan(args.nodes, args.rate_mbit) as wan, \
                work_folder("cotrain-wan-", keep=args.keep) as workdir:
            (workdir / "run.toml").write_text(make_config(args).to_toml())
            print(f"WAN: {args.nodes} namespaces on {SUBNET}.0/24, each link {args.rate_mbit:g} Mbit/s each way; "
                  f"work folder {workdir}", flush=True)
            for side in args.sides:
                print(f"{side}: up to {args.budget_s:g}s to reach val_loss {args.target_val_loss}", flush=True)
                results[side] = (run_cotrain if side == "cotrain" else run_ddp)(args, wan, workdir)
                r = results[side]
                reached = f"{r['time_to_target_s']:.1f}s" if r["time_to_target_s"] is not None else "not reached"
                final = f"{r['final_val_loss']:.4f}" if r["final_val_loss"] is not None else "-"
                print(f"  {side}: target {reached}, final val_loss {final}, {r['bytes_per_node']:,.0f} bytes/node",
                      flush=True)
    except BuildFailed as e:
        print(f"bench/wan.py needs root and network namespaces; building them failed: {e}", file=sys.stderr)
        return 2
    except Interrupted:
        return 130

    def cell(value, unit=""):
        return "not reached" if value is None else (f"{value:.1f}{unit}" if isinstance(value, float) else value)

    rows = [[side, cell(r["time_to_target_s"], " s"), r["final_val_loss"] if r["final_val_loss"] is not None
             else "-", r["bytes_per_node"], r["iface_tx_bytes_per_node"], r["wall_s"]] for side, r in results.items()]
    print_table(f"WAN: {args.nodes} workers, {args.rate_mbit:g} Mbit/s links, LSTM {args.layers}x{args.hidden}, "
                f"target val loss {args.target_val_loss}",
                ["side", "time to target", "final val loss", "bytes sent/node", "iface tx/node", "wall s"], rows)
    figures = dict(rate_mbit=args.rate_mbit, target_val_loss=args.target_val_loss, nodes=args.nodes,
                   budget_s=args.budget_s, model=dict(hidden=args.hidden, layers=args.layers, seq_len=args.seq_len,
                                                      batch_size=args.batch_size), H=args.H)
    for side, r in results.items():
        figures[side] = r
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
