"""A trainer's experts when they live on expert hosts (``moe.experts = "hosted"``).

The model is built before the node joins the data plane, so each mixture layer gets a :class:`HostedExperts`, which
has no expert until :class:`TrainerExperts` attaches a :class:`~cotrain.moe.host.RemoteExperts` to it (a step taken
before that, or while no host holds an expert, is refused by the layer as too few experts, and the trainer skips it).
:class:`TrainerExperts` reads where each expert lives from the coordinator (``GetExperts``) at start and every
``refresh_s``, and keeps the last answer while the coordinator is away: the hosts serve on without it. A
:class:`HostedExperts` is not a module, so the experts' weights are no part of the trainer's shared state: the
trainers average the embedding, the recurrent layers, the gates and the head, and the hosts train the experts.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Mapping, Optional, Sequence

import torch

from cotrain.moe.assignment import run_experts
from cotrain.moe.gating import expert_uid, grid_experts
from cotrain.outage import Outage

logger = logging.getLogger(__name__)

#: seconds between two reads of the directory: a host that leaves has its experts moved by the coordinator within
#: its pool's 15 s and a report; a trainer that reads every 5 s calls the new host within about 25 s of the loss
REFRESH_S = 5.0


def layer_hosts(directory: Mapping[str, str], layer: int, grid: Sequence[int]) -> dict[int, tuple[str, str]]:
    """The coordinator's directory (expert uid -> its host's peer id) -> layer ``layer``'s experts that have a host:
    grid index -> (uid, peer id). Uids of other layers, or not of the grid, are left out."""
    out = {}
    for index, cell in enumerate(grid_experts(grid)):
        uid = expert_uid(f"moe{layer}", cell)
        peer = directory.get(uid)
        if peer:
            out[index] = (uid, peer)
    return out


class HostedExperts:
    """One mixture layer's experts on their hosts (:class:`cotrain.moe.mixture.Experts`): none until
    :meth:`attach`."""

    def __init__(self, layer: int):
        self.layer = layer
        self.remote = None  # a RemoteExperts once the node is on the data plane

    def attach(self, remote) -> None:
        self.remote = remote

    def available(self) -> list[int]:
        return [] if self.remote is None else self.remote.available()

    def __call__(self, requests: dict[int, torch.Tensor]) -> dict[int, Optional[torch.Tensor]]:
        if self.remote is None:
            return {e: None for e in requests}
        return self.remote(requests)


def hosted_layers(model: torch.nn.Module) -> list[HostedExperts]:
    """The :class:`HostedExperts` of a model's mixture layers, in order (none for any other model)."""
    layers = getattr(getattr(model, "rnn", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        return []
    return [layer.experts for layer in layers if isinstance(getattr(layer, "experts", None), HostedExperts)]


class TrainerExperts:
    """The clients of a run's hosted experts: one :class:`~cotrain.moe.host.RemoteExperts` a mixture layer, on
    ``dht``'s daemon, presenting ``admission``'s credential, calling the hosts ``fetch()`` names (uid -> peer id:
    the coordinator's directory). :meth:`attach` gives them to a model's :class:`HostedExperts` (a trainer's model,
    or the coordinator's evaluation copy)."""

    def __init__(self, dht, namespace: str, admission, layers: int, grid: Sequence[int],
                 fetch: Callable[[], dict[str, str]], timeout_s: float, down_s: float, refresh_s: float = REFRESH_S):
        from cotrain.moe.host import RemoteExperts

        self.grid, self.fetch, self.refresh_s = tuple(grid), fetch, refresh_s
        self.known = set(run_experts(grid, layers))
        self.remotes = [RemoteExperts(dht, namespace, admission, {}, timeout_s, down_s) for _ in range(layers)]
        self.outage = Outage("the experts' directory", logger)
        self.reason = "the experts' directory was not read yet"
        self._thread: Optional[threading.Thread] = None

    def attach(self, model: torch.nn.Module) -> None:
        """Give ``model``'s mixture layers (:func:`hosted_layers`) their clients."""
        layers = hosted_layers(model)
        if len(layers) != len(self.remotes):
            raise ValueError(f"model: {len(layers)} hosted mixture layers, {len(self.remotes)} expected")
        for layer in layers:
            layer.attach(self.remotes[layer.layer])

    def refresh(self) -> bool:
        """Read the directory once and move each layer's calls to its experts' hosts; on failure keep the last
        (logged once an outage). -> whether it was read."""
        from hivemind.p2p import PeerID

        try:
            directory = self.fetch()
        except Exception as e:  # noqa: BLE001 - the coordinator away: the hosts serve on without it
            self.outage.failed(e, action="calling the experts where they were")
            return False
        self.outage.succeeded()
        directory = {uid: peer for uid, peer in directory.items() if uid in self.known}
        for layer, remote in enumerate(self.remotes):
            hosts = {}
            for index, (uid, peer) in layer_hosts(directory, layer, self.grid).items():
                try:
                    hosts[index] = (uid, PeerID.from_base58(peer))
                except (ValueError, TypeError):  # the coordinator's directory holds what hosts registered
                    continue
            remote.set_hosts(hosts)
        self.reason = f"{len(directory)} of {len(self.known)} experts have a host"
        return True

    def start(self, stop: threading.Event) -> None:
        """Read the directory now, then every ``refresh_s`` on a thread of its own until ``stop``."""
        self.refresh()
        logger.info("mixture of experts on hosts: %s", self.reason)

        def loop():
            while not stop.wait(self.refresh_s):
                self.refresh()

        self._thread = threading.Thread(target=loop, name="experts-directory", daemon=True)
        self._thread.start()

    def calls_failed(self) -> int:
        return sum(sum(r.failed.values()) for r in self.remotes)

    def shutdown(self) -> None:
        """Before the DHT: each client of its daemon is closed first."""
        for remote in self.remotes:
            remote.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=self.refresh_s + 15)


def connect_trainer(dht, run_id: str, cfg, admission, model: torch.nn.Module, fetch: Callable[[], dict[str, str]],
                    stop: threading.Event) -> TrainerExperts:
    """A trainer's clients of the run's expert hosts (``cfg.hosts_experts``), attached to ``model``'s mixture layers;
    where each expert lives is read with ``fetch()`` now and every :data:`REFRESH_S` until ``stop``."""
    from cotrain.moe.host import expert_namespace

    experts = TrainerExperts(dht, expert_namespace(run_id), admission, cfg.moe.layers, cfg.moe.grid, fetch,
                             cfg.moe.timeout_s, cfg.moe.down_s)
    experts.attach(model)
    experts.start(stop)
    return experts
