"""The operator's own machines, through Ray: managed nodes and evaluation tasks.

Only the operator's trusted machines are in the Ray cluster (Ray is unauthenticated and runs arbitrary code);
volunteers never join it, they speak gRPC to the coordinator and hivemind to each other. A managed node joins
exactly like a volunteer (`cotrain node join` with a token the coordinator makes for its fleet), so the swarm does not
know or care which nodes are whose.

- :class:`Fleet` connects to a Ray cluster (``address``: ``auto``, ``ray://HOST:PORT`` or ``HOST:PORT``) or, without
  an address, starts a local Ray instance that it stops again on :meth:`Fleet.shutdown`.
- :meth:`Fleet.start_nodes` reserves a placement group (one bundle per node, spread over the cluster's machines)
  and starts one :class:`ManagedNode` actor per bundle. The actor supervises a `cotrain node join` process on its
  machine; when that process dies unexpectedly the actor ends itself and Ray restarts it (``max_restarts``), which
  starts the node again with the same identity (state dir): it rejoins and downloads the swarm's state.
- :meth:`Fleet.submit` runs a function as a Ray task (evaluations), so no node ever stops to evaluate.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

logger = logging.getLogger(__name__)

#: exit codes of a node that restarting cannot fix (see cotrain.exit_codes): refused token, config, protocol
PERMANENT_EXIT_CODES = (2, 3, 4, 5, 7)


class FleetError(RuntimeError):
    """Ray could not be reached, or cannot place the managed nodes; the message names the flag."""


class FleetSizeError(FleetError):
    """The managed nodes' CPUs cannot fit the cluster (a config error, refused before anything starts); the message
    names the flags and the figures."""


#: Ray counts resources in units of 1/10000 (``ray._raylet.RESOURCE_UNIT_SCALING``): a finer share is refused
RAY_RESOURCE_UNITS = 10_000
#: CPUs one of the coordinator's evaluation tasks reserves (:meth:`Fleet.submit`)
EVAL_TASK_CPUS = 1


def _units(cpus: float) -> int:
    """``cpus`` in Ray's units, rounded down (a hair of float error, 0.29 * 10000 = 2899.9999..., is not a unit)."""
    return math.floor(cpus * RAY_RESOURCE_UNITS + 1e-6)


def ray_share(cpus: float) -> float:
    """A CPU share as Ray reserves it: rounded down to Ray's 1/10000 (never up, so n shares fit where n x ``cpus``
    fit)."""
    return _units(cpus) / RAY_RESOURCE_UNITS


def _whole(units: int) -> int:
    """The whole CPUs that hold ``units`` (integer arithmetic: 3 x 0.6667 is 2.0001 CPUs, 3, and 3 x 0.5 is 2)."""
    return -(-units // RAY_RESOURCE_UNITS)


@dataclass(frozen=True)
class RayResources:
    """What the fleet asks of Ray for its managed nodes (:func:`ray_resources`)."""

    #: CPUs each managed node reserves (its placement group bundle and actor): a multiple of 1/10000, fractions allowed
    share: float
    #: the managed nodes' CPUs together (``share`` x the nodes)
    nodes_cpus: float
    #: a local Ray instance: the whole CPUs it is started with; a cluster: the CPUs it has
    num_cpus: int
    #: why the nodes cannot fit, naming the flags and the figures; None when they fit
    refusal: Optional[str] = None
    #: something the operator should know that is no refusal (e.g. no CPU left for evaluation tasks)
    warning: Optional[str] = None


def ray_resources(managed_nodes: int, managed_node_cpus: float, machine_cpus: int,
                  cluster_cpus: Optional[float] = None, largest_machine_cpus: Optional[float] = None,
                  where: str = "the Ray cluster") -> RayResources:
    """The Ray resources of ``managed_nodes`` nodes of ``managed_node_cpus`` CPUs each.

    Ray wants whole CPUs for a node it starts (``ray.init(num_cpus=...)``) and accepts fractional shares of them
    down to 1/10000 for placement group bundles and actors; the share is rounded down to that.

    A local Ray instance (``cluster_cpus`` None) runs on this machine of ``machine_cpus`` CPUs and is started with
    ``num_cpus`` = the machine's CPUs, or more where the nodes' shares plus an evaluation task of the coordinator
    take more (oversubscribed on purpose: ``cotrain simulate`` runs 8 nodes on 2 cores). A share larger than the
    machine is refused: no node of that size runs here.

    A cluster of ``cluster_cpus`` CPUs (its largest machine: ``largest_machine_cpus``) is not ours to size: the
    nodes' shares together must fit in it, and one share in one machine (a node runs on one)."""
    units = _units(managed_node_cpus)
    share = units / RAY_RESOURCE_UNITS
    nodes_units = managed_nodes * units
    nodes_cpus = nodes_units / RAY_RESOURCE_UNITS
    flags = f"--managed-nodes {managed_nodes} x --managed-node-cpus {managed_node_cpus:g}"
    if units <= 0:
        return RayResources(share, nodes_cpus, max(1, machine_cpus) if cluster_cpus is None else int(cluster_cpus),
                            refusal=f"--managed-node-cpus {managed_node_cpus:g}: Ray reserves CPUs in steps of "
                                    f"{1 / RAY_RESOURCE_UNITS:g}; pass at least that")
    if cluster_cpus is None:
        num_cpus = max(int(machine_cpus), _whole(nodes_units) + EVAL_TASK_CPUS)
        refusal = None
        if units > int(machine_cpus) * RAY_RESOURCE_UNITS:
            refusal = (f"--managed-node-cpus {managed_node_cpus:g}: more than the {int(machine_cpus)} CPU(s) of this "
                       f"machine, where the local Ray instance runs its managed nodes; pass at most "
                       f"{int(machine_cpus)}, or --ray-address for a Ray cluster with larger machines")
        return RayResources(share, nodes_cpus, num_cpus, refusal)
    num_cpus = math.floor(cluster_cpus + 1e-6)
    cluster_units = _units(cluster_cpus)
    refusal = warning = None
    if nodes_units > cluster_units:
        refusal = (f"{flags} = {nodes_cpus:g} CPUs: more than the {cluster_cpus:g} CPUs of {where}; pass fewer "
                   f"--managed-nodes or a smaller --managed-node-cpus")
    elif largest_machine_cpus is not None and units > _units(largest_machine_cpus):
        refusal = (f"--managed-node-cpus {managed_node_cpus:g}: more than the largest machine of {where} has "
                   f"({largest_machine_cpus:g} CPUs), and a managed node runs on one machine; pass at most "
                   f"{largest_machine_cpus:g}")
    elif nodes_units + EVAL_TASK_CPUS * RAY_RESOURCE_UNITS > cluster_units:
        warning = (f"{flags} = {nodes_cpus:g} of the {cluster_cpus:g} CPUs of {where}: the coordinator's evaluation "
                   f"tasks ({EVAL_TASK_CPUS} CPU each) wait until one is free")
    return RayResources(share, nodes_cpus, num_cpus, refusal, warning)


class ManagedNodeProcess:
    """The body of the :class:`ManagedNode` actor (plain Python, so it can be tested without Ray): starts
    ``cotrain node join ARGS`` and watches it. ``on_crash`` is called when the node dies unexpectedly."""

    def __init__(self, args: Sequence[str], log_path: str, on_crash: Callable[[int], None]):
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        from cotrain.averaging.dht import kill_me_with_parent  # hivemind and torch: only where a node starts

        self.args, self.log_path, self.on_crash = list(args), log_path, on_crash
        self._log = open(log_path, "ab")
        self._stopping = False
        self.proc = subprocess.Popen([sys.executable, "-m", "cotrain.cli", "node", "join", *self.args],
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                     preexec_fn=kill_me_with_parent)  # the node dies with its actor
        self._watcher = threading.Thread(target=self._watch, name="watch-node", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        code = self.proc.wait()
        if self._stopping or code == 0:
            return  # stopped by us, or finished its run (--max-rounds, drained)
        if code in PERMANENT_EXIT_CODES:
            logger.error("managed node exited with code %d; not restarting it (see %s)", code, self.log_path)
            return
        self.on_crash(code)

    def pid(self) -> int:
        return self.proc.pid

    def exit_code(self) -> Optional[int]:
        return self.proc.poll()

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        self._stopping = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        code = self.proc.wait()
        self._log.close()
        return code


def _crash_actor(code: int) -> None:
    logger.warning("managed node died with code %d; restarting its actor", code)
    os._exit(1)  # Ray sees the actor die and restarts it (max_restarts), which starts the node again


class ManagedNode:
    """A Ray actor (see :meth:`Fleet.start_nodes`): one supervised node process."""

    def __init__(self, args: Sequence[str], log_path: str):
        self.body = ManagedNodeProcess(args, log_path, on_crash=_crash_actor)

    def pid(self) -> int:
        return self.body.pid()

    def exit_code(self) -> Optional[int]:
        return self.body.exit_code()

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        return self.body.stop(timeout)


@dataclass
class ManagedNodeSpec:
    coordinator: str  # HOST:PORT the nodes dial
    token: str
    state_root: Path  # node i keeps its identity in state_root/node-i (on the machine it runs on)
    insecure: bool
    ca: Optional[str] = None
    cpus_per_node: float = 1.0
    extra_args: tuple = ()


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail fast on an address nothing listens on (Ray itself retries for minutes)."""
    import socket

    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    try:
        port_number = int(port)
    except ValueError:
        raise FleetError(f"--ray-address: expected auto, HOST:PORT or ray://HOST:PORT, got {address!r}") from None
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", port_number), timeout=timeout).close()
    except OSError as e:
        raise FleetError(f"--ray-address {address}: nothing answers there ({e.strerror or e})") from None


@contextlib.contextmanager
def _keep_signal_handlers():
    """ray.init installs its own SIGINT/SIGTERM handlers in the driver; the coordinator keeps its own."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


class Fleet:
    def __init__(self, address: Optional[str] = None, num_cpus: Optional[int] = None):
        """``num_cpus``: of a local Ray instance (see :func:`ray_resources`), a whole number as Ray wants it."""
        import ray

        self.ray = ray
        self.local = not address
        self.closed = False
        if address and address != "auto":
            _check_reachable(address)
        try:
            with _keep_signal_handlers():
                if self.local:
                    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                             configure_logging=False, namespace="cotrain")
                else:
                    ray.init(address=address, log_to_driver=False, configure_logging=False, namespace="cotrain")
        except Exception as e:
            where = f"the Ray cluster at --ray-address {address}" if address else "a local Ray instance"
            raise FleetError(f"cannot start or reach {where}: {e}") from None
        resources = ray.cluster_resources()
        logger.info("Ray %s: %s CPUs in the cluster", "started locally" if self.local else f"at {address}",
                    resources.get("CPU", 0))
        self.actors: list = []
        self.placement_group = None

    def cluster_cpus(self) -> tuple[float, float]:
        """-> (the CPUs of the Ray cluster, those of its largest live machine)."""
        machines = [n.get("Resources", {}).get("CPU", 0.0) for n in self.ray.nodes() if n.get("Alive")]
        return float(self.ray.cluster_resources().get("CPU", 0.0)), float(max(machines, default=0.0))

    def start_nodes(self, count: int, spec: ManagedNodeSpec, timeout: float = 120.0) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if count <= 0:
            return
        share = ray_share(spec.cpus_per_node)  # Ray refuses a share finer than its units
        self.placement_group = placement_group([{"CPU": share}] * count, strategy="SPREAD")
        try:
            self.ray.get(self.placement_group.ready(), timeout=timeout)
        except Exception as e:
            raise FleetError(f"--managed-nodes: the Ray cluster cannot place {count} node(s) of "
                               f"{share:g} CPU each within {timeout:.0f}s ({e!r})") from None
        actor_cls = self.ray.remote(ManagedNode)
        for i in range(count):
            state_dir = spec.state_root / f"node-{i}"
            args = [spec.coordinator, "--token", spec.token, "--name", f"managed-{i}", "--state-dir", str(state_dir),
                    "--threads", str(max(1, int(share))),
                    *(["--insecure"] if spec.insecure else ["--ca", spec.ca] if spec.ca else []), *spec.extra_args]
            actor = actor_cls.options(
                name=None, num_cpus=share, max_restarts=-1, max_task_retries=3,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self.placement_group,
                                                                     placement_group_bundle_index=i),
            ).remote(args, str(state_dir / "node.log"))
            self.actors.append(actor)
        pids = self.ray.get([a.pid.remote() for a in self.actors], timeout=timeout)
        logger.info("started %d managed node(s) through Ray (pids %s)", count, pids)

    def node_pids(self, timeout: float = 30.0) -> list[int]:
        return self.ray.get([a.pid.remote() for a in self.actors], timeout=timeout)

    def submit(self, fn: Callable, *args, num_cpus: float = 1.0):
        """Run ``fn(*args)`` as a Ray task; -> an object ref (see :meth:`done` and :meth:`result`)."""
        return self.ray.remote(num_cpus=num_cpus, max_retries=1)(fn).remote(*args)

    def done(self, ref) -> bool:
        self._check_open()
        ready, _ = self.ray.wait([ref], timeout=0)
        return bool(ready)

    def result(self, ref, timeout: Optional[float] = None):
        self._check_open()
        return self.ray.get(ref, timeout=timeout)

    def _check_open(self) -> None:
        """After :meth:`shutdown` Ray is never called again: ray.wait on a stopped session would start a new local
        Ray instance by itself (a coordinator's shutdown once hung on it past its 30 s)."""
        if self.closed:
            raise FleetError("the fleet is shut down")

    def shutdown(self, timeout: float = 30.0) -> None:
        from ray.util.placement_group import remove_placement_group

        self.closed = True

        stops = []
        for actor in self.actors:
            with contextlib.suppress(Exception):
                stops.append(actor.stop.remote(timeout))
        deadline = time.monotonic() + timeout + 5
        for ref in stops:
            with contextlib.suppress(Exception):
                self.ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
        for actor in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
        if self.placement_group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.placement_group)
        self.ray.shutdown()
        logger.info("Ray %s", "stopped" if self.local else "disconnected")
