"""What a volunteer can set about their node: :class:`NodeOptions` (what the node runs with) and :data:`FLAGS`
(how ``cotrain node join`` and a node config file set them). Every option is declared once, here: the command
line's flags, the config file's keys, their checks and their defaults all come from these two.

Nothing here imports torch or hivemind, so that ``cotrain node join --help`` and a bad flag answer at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from cotrain.config import ATTACKS
from cotrain.node.limits import parse_cpu_list, parse_size


@dataclass
class NodeOptions:
    coordinator: str
    token: str
    name: str
    insecure: bool = False
    ca: Optional[str] = None
    #: keeps this node's identity (node id, DHT key) so that a restart resumes as the same node
    state_dir: Optional[Path] = None
    #: stop after this many local steps / averaging rounds / seconds (0: run until stopped)
    max_steps: int = 0
    max_rounds: int = 0
    duration: float = 0.0
    #: torch threads for training (0: one per CPU this node may use, see cotrain.node.limits.torch_threads)
    threads: int = 0
    #: address the node's DHT peer listens on; client mode makes only outgoing connections (behind NAT)
    dht_host: str = "127.0.0.1"
    dht_port: int = 0
    dht_announce: tuple = ()
    client_mode: bool = False
    #: announce the DHT address even when the coordinator cannot dial it (benches of what that costs the swarm)
    assume_public: bool = False
    log_every_s: float = 10.0
    #: a volunteer's limits (0 / False: none); see cotrain.node.limits
    max_cpus: int = 0
    cpu_limit: float = 0.0
    #: run on these CPUs only (of those the process may use; empty: all of them), as ``taskset -c`` would
    cpus: tuple = ()
    max_memory: int = 0
    max_upload_mbps: float = 0.0
    only_when_idle: bool = False
    #: before the first step, wait (up to wait_peers_timeout s) until this many peers are in the swarm
    wait_peers: int = 0
    wait_peers_timeout: float = 300.0
    state_download_timeout: float = 30.0
    #: byzantine for benches and tests: the contributions this node sends (cotrain.averaging.attacks)
    attack: str = ""
    #: for benches of weights by work: this node claims this many times the samples it trained on
    claim_multiple: float = 1.0
    #: for benches and tests of stragglers: seconds of extra "compute" after every local step (a slower machine)
    step_delay: float = 0.0
    #: for benches and tests: a JSON line per local step and per applied round (cotrain.node.step_record)
    step_record: Optional[Path] = None


@dataclass(frozen=True)
class Flag:
    """One option as a volunteer gives it: ``kind`` is what the command line parses and the config file must hold;
    ``convert`` turns it into the :class:`NodeOptions` field (a size like "4G" into bytes, ...)."""

    name: str
    kind: type
    help: str
    group: str = ""  # "" | "limits" | "tls" (--ca and --insecure exclude each other)
    metavar: Optional[str] = None
    choices: Optional[tuple] = None
    limits: Optional[tuple[float, float]] = None  # allowed range, both ends included
    convert: Optional[Callable] = None
    hidden: bool = False  # for benches: not in --help

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _announce(value: str) -> tuple:
    return (value,) if value else ()


def _size(value: str) -> int:
    return parse_size(value) if value else 0


NEVER = "0: never"
FLAGS = (
    Flag("coordinator", str, "the coordinator's HOST:PORT (or `coordinator` in --config)"),
    Flag("token", str, "join token the operator gave you"),
    Flag("name", str, "name shown on the dashboard (default: hostname)"),
    Flag("state_dir", str, "keeps this node's identity, so a restart resumes as the same node", convert=Path),
    Flag("max_steps", int, f"leave after this many local steps ({NEVER})", limits=(0, float("inf"))),
    Flag("max_rounds", int, f"leave after this many averaging rounds ({NEVER})", limits=(0, float("inf"))),
    Flag("duration", float, f"leave after this many seconds ({NEVER})", limits=(0, float("inf"))),
    Flag("threads", int, "torch threads for training (default 0: one per CPU this node may use)",
         limits=(0, float("inf"))),
    Flag("wait_peers", int, "before training, wait (up to 5 minutes) until this many peers are in the swarm",
         limits=(0, float("inf"))),
    Flag("dht_host", str, "address the DHT peer listens on (default 127.0.0.1: this machine only; 0.0.0.0 lets "
                          "other volunteers connect)"),
    Flag("dht_port", int, "port the DHT peer listens on (default 0: any free port; fix it to forward it on a "
                          "router)", limits=(0, 65535)),
    Flag("dht_announce", str, "address to tell peers instead of the listening one (a public address)",
         metavar="MULTIADDR", convert=_announce),
    Flag("client_mode", bool, "make outgoing DHT connections only (behind NAT; cannot serve state to others)"),
    Flag("assume_public", bool, "announce the DHT address even when the coordinator cannot dial it", hidden=True),
    Flag("attack", str, "for benches and tests of robust aggregation only: this node sends corrupted updates",
         choices=tuple(ATTACKS)),
    Flag("claim_multiple", float, "for benches of weights by work only: claim this many times the samples this node "
                                  "trained on", limits=(1, 1e12), hidden=True),
    Flag("step_delay", float, "for benches and tests of stragglers: seconds added to every local step, as on a "
                              "slower machine", limits=(0, 60), hidden=True),
    Flag("step_record", str, "for benches and tests: write a JSON line per local step (its lr) and per applied "
                              "round (its state hash) to this file", metavar="FILE", convert=Path, hidden=True),
    Flag("max_cpus", int, "use at most this many CPUs", group="limits", limits=(0, float("inf"))),
    Flag("cpu_limit", float, "use at most this much CPU time, in CPUs (0.5: half of one core), the node's helper "
                             "processes included; enforced by a cgroup quota (needs root or a delegated cgroup)",
         group="limits", limits=(0, float("inf"))),
    Flag("cpus", str, "run on these CPUs only (e.g. 0,1 or 0-3, as taskset -c); with --max-cpus, the first of them",
         group="limits", metavar="LIST", convert=parse_cpu_list),
    Flag("max_memory", str, "leave cleanly when using more memory than this (e.g. 4G), all its processes together "
                            "(proportional set size: shared pages split between the processes sharing them)",
         group="limits", convert=_size),
    Flag("max_upload_mbps", float, "cap what this node sends, in Mbit/s", group="limits", limits=(0, float("inf"))),
    Flag("only_when_idle", bool, "pause training while other programs keep this machine busy", group="limits"),
    Flag("ca", str, "CA certificate that signed the coordinator's TLS certificate (default: the system's roots)",
         group="tls", metavar="FILE"),
    Flag("insecure", bool, "plaintext gRPC, for loopback demos and tests", group="tls"),
)
OPTIONS = {f.name: f for f in FLAGS}
assert set(OPTIONS) <= {f.name for f in dataclasses.fields(NodeOptions)}, "a flag without a NodeOptions field"

