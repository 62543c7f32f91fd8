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
    def __init__(self, address: Optional[str] = None, num_cpus: Optional[float] = None):
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

    def start_nodes(self, count: int, spec: ManagedNodeSpec, timeout: float = 120.0) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if count <= 0:
            return
        self.placement_group = placement_group([{"CPU": spec.cpus_per_node}] * count, strategy="SPREAD")
        try:
            self.ray.get(self.placement_group.ready(), timeout=timeout)
        except Exception as e:
            raise FleetError(f"--managed-nodes: the Ray cluster cannot place {count} node(s) of "
                               f"{spec.cpus_per_node:g} CPU each within {timeout:.0f}s ({e!r})") from None
        actor_cls = self.ray.remote(ManagedNode)
        for i in range(count):
            state_dir = spec.state_root / f"node-{i}"
            args = [spec.coordinator, "--token", spec.token, "--name", f"managed-{i}", "--state-dir", str(state_dir),
                    "--threads", str(max(1, int(spec.cpus_per_node))),
                    *(["--insecure"] if spec.insecure else ["--ca", spec.ca] if spec.ca else []), *spec.extra_args]
            actor = actor_cls.options(
                name=None, num_cpus=spec.cpus_per_node, max_restarts=-1, max_task_retries=3,
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
