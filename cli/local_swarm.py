"""A swarm on this machine, for the tests and the benches: its run config (:func:`swarm_config`, a base with
per-section overrides) and its processes (:class:`Swarm`, a coordinator and the nodes started against it).

    cfg = swarm_config(BASE, averaging={"inner_steps": 20})
    with Swarm(cfg, workdir, nodes=3) as swarm:
        nodes = [swarm.start_node(f"node-{i}") for i in range(3)]  # each its share of this machine's CPUs
        ...                                  # swarm.health(), swarm.node_rows(), swarm.checkpoints()
    # here every process the swarm started has been stopped, however the block ended
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from cotrain.config import RunConfig
from cotrain.cli.launch import Proc, cpu_shares, start_coordinator, start_node, stop_all, uninterrupted
from cotrain.cli.zygote import Zygote


def swarm_config(*layers: dict[str, Any], **sections: Any) -> RunConfig:
    """The run config of ``layers``, then ``sections``, merged in that order: each maps a run config's keys to their
    values as run.toml has them (``{"averaging": {"inner_steps": 20}}``, ``device="cpu"``). A section (a dict) adds
    its fields to the same section of those before it, replacing the fields they share; any other value replaces
    the earlier one. What none sets takes :class:`RunConfig`'s default. Raises ConfigError as
    :meth:`RunConfig.from_dict` does."""
    merged: dict[str, Any] = {}
    for layer in (*layers, sections):
        for key, value in layer.items():
            if isinstance(value, dict):
                merged[key] = {**(merged.get(key) if isinstance(merged.get(key), dict) else {}), **value}
            else:
                merged[key] = value
    return RunConfig.from_dict(merged)


def create_token(state_dir: Path, name: str) -> str:
    """A join token named ``name`` in the coordinator state dir ``state_dir`` (created if missing)."""
    from cotrain.coordinator.store import Store

    store = Store(state_dir)
    try:
        return store.create_token(name)
    finally:
        store.close()


class Swarm:
    """A coordinator and the nodes started against it, all in ``workdir``: the coordinator's state in
    ``workdir/coordinator`` (:attr:`state_dir`), node NAME's in ``workdir/NAME`` (its log in ``node.log`` there)
    unless :meth:`start_node` is given another, the run config in ``workdir/run.toml`` unless ``config`` is the path
    of one (:attr:`config_path`). :meth:`start` (or entering it as a context manager) makes a join token named
    ``token_name`` (:attr:`token`) and starts the coordinator (:attr:`proc`, at :attr:`address`, what it wrote in
    ``coordinator.json`` in :attr:`info`); :meth:`close` (or the end of the ``with`` block, however it ends) stops
    every process it started, nodes and :meth:`add`-ed ones first, then the coordinator, and a second Ctrl-C cannot
    cut that short.

    ``listen`` is the coordinator's address, ``extra`` more ``coordinator start`` flags, ``prefix`` a command its
    process runs under (``ip netns exec NAME``).
    ``nodes``: how many nodes run at once; each node name started gets its share of this machine's CPUs
    (:func:`cotrain.cli.launch.cpu_shares`; a restarted node its own again, names beyond ``nodes`` those of the first
    ones), before its own flags, which win. 0: no share, every node takes the CPUs its flags say (default: all).
    ``zygote``: fork processes from a :class:`~cotrain.cli.zygote.Zygote` (they share one copy of torch and hivemind:
    what a process adds to the machine, not a whole Python each). True: the nodes, from a zygote the swarm starts
    after its coordinator and closes at its end (the coordinator is a Python of its own); a Zygote: the coordinator
    and the nodes, from that one, which stays open. False: every process is a Python of its own."""

    def __init__(self, config: Union[RunConfig, Path], workdir: Path, listen: str = "127.0.0.1:0",
                 prefix: Sequence[str] = (), token_name: str = "swarm", nodes: int = 0,
                 zygote: Union[bool, Zygote] = False, extra: Sequence[str] = ()):
        self.workdir, self.listen, self.prefix, self.extra = Path(workdir), listen, list(prefix), list(extra)
        self._cfg = config if isinstance(config, RunConfig) else None
        self.config_path = self.workdir / "run.toml" if self._cfg is not None else Path(config)
        self._shares = cpu_shares(nodes)
        self._share_of: dict[str, list[str]] = {}
        self.token_name = token_name
        self.state_dir = self.workdir / "coordinator"
        self.proc: Optional[Proc] = None  # the coordinator process
        self.address = self.token = ""
        self.info: dict = {}
        self.nodes: list[Proc] = []  # every node process started, in order (a restarted node twice)
        self._others: list = []
        self._client = None
        self._own_zygote = zygote is True
        self.zygote: Optional[Zygote] = zygote if isinstance(zygote, Zygote) else None

    @property
    def cfg(self) -> RunConfig:
        """The run config the coordinator was started with."""
        if self._cfg is None:
            self._cfg = RunConfig.load(self.config_path)
        return self._cfg

    def start(self) -> "Swarm":
        """Write the run config (when given one), make the token and start the coordinator; -> this swarm. Whatever
        fails on the way, what it had started is stopped."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._cfg is not None:
            self.config_path.write_text(self._cfg.to_toml())
        self.token = create_token(self.state_dir, self.token_name)
        self.proc, self.address = start_coordinator(self.state_dir, self.config_path, listen=self.listen,
                                                    extra=self.extra, prefix=self.prefix, zygote=self.zygote)
        try:
            self.info = json.loads((self.state_dir / "coordinator.json").read_text())
            if self._own_zygote:
                self.zygote = Zygote(self.workdir / "zygote.log")
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> "Swarm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start_node(self, name: str, extra: Sequence[str] = (), prefix: Sequence[str] = (),
                   state_dir: Optional[Path] = None, log_path: Optional[Path] = None) -> Proc:
        """``cotrain node join`` with the swarm's token, its CPU share (see ``nodes``) and ``extra`` flags, state dir
        ``state_dir`` (default ``workdir/NAME``; the same again is the same node restarting), its log at
        ``log_path`` (default ``node.log`` in the state dir), under the command ``prefix``; forked from the
        swarm's zygote when it has one and ``prefix`` is empty."""
        if name not in self._share_of:
            self._share_of[name] = self._shares[len(self._share_of) % len(self._shares)] if self._shares else []
        proc = start_node(self.address, self.token, name, state_dir or self.workdir / name, log_path,
                          extra=[*self._share_of[name], *extra], prefix=prefix, zygote=self.zygote)
        self.nodes.append(proc)
        return proc

    def add(self, proc):
        """Another process (a status watcher) to stop with the nodes; returns it."""
        self._others.append(proc)
        return proc

    @property
    def client(self):
        """A :class:`~cotrain.client.CoordinatorClient` of the coordinator (plaintext), closed by :meth:`close`."""
        if self._client is None:
            from cotrain.client import CoordinatorClient

            self._client = CoordinatorClient(self.address, insecure=True)
        return self._client

    def health(self):
        """The coordinator's health view (``SwarmHealth``: totals, a row per node with its last metrics)."""
        return self.client.health()

    def node_rows(self) -> list[dict]:
        """The last metrics each node reported (its heartbeat ``NodeMetrics``), with ``name``."""
        from cotrain.status import message_to_dict

        return [dict(message_to_dict(n.metrics), name=n.node_name) for n in self.health().nodes]

    def checkpoints(self):
        """The coordinator's checkpoints (``CheckpointRow``), newest first."""
        from cotrain.coordinator.store import Store

        store = Store(self.state_dir)
        try:
            return store.checkpoints()
        finally:
            store.close()

    def stop_nodes(self, timeout: float = 30.0) -> list[Optional[int]]:
        """Stop every node (see :func:`~cotrain.cli.launch.stop_all`); their exit codes, in the order they were
        started."""
        return stop_all(self.nodes, timeout)

    def stop_coordinator(self, timeout: float = 30.0) -> Optional[int]:
        """Stop the coordinator alone (SIGTERM, up to ``timeout`` seconds, then its process group); its exit code.
        The nodes keep running."""
        return self.proc.stop(timeout) if self.proc is not None else None

    def close(self) -> None:
        """Stop every process the swarm started (see the class), uninterrupted; the zygote it started, and its
        client, too."""
        with uninterrupted():
            if self._client is not None:
                self._client.close()
                self._client = None
            stop_all(self.nodes + self._others, 30.0)
            if self._own_zygote and self.zygote is not None:
                self.zygote.close()
                self.zygote = None
            if self.proc is not None:
                self.proc.stop(30)
