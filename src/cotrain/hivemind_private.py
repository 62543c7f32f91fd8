"""The one place cotrain uses hivemind's private API, each use checked by tests/test_hivemind_private.py, which
fails when a hivemind release changes it.

- ``P2P._client``: the libp2p daemon's client. hivemind's public P2P API opens streams to a peer it already
  knows, but has no call that dials a peer at given addresses and reports whether the connection opened, which is
  what the coordinator's reachability check needs (coordinator/reachability.py).
- ``ControlClient._handle_persistent_request`` and ``_handler_tasks``: hivemind keeps a task for every unary request
  its process serves and forgets it only when the handler returns. A request its caller gave up on (a DHT request
  past its timeout, an exchange fetch from a peer that went away) is cancelled, and its task, with the request's
  bytes, stays for the life of the process: one for every abandoned request, in every node, DHT process and the
  coordinator. :func:`forget_finished_handlers` (applied when this module is imported, before any DHT process is
  forked) forgets it however the handler ends. hivemind 1.1.12 and its master have the leak.
"""

from __future__ import annotations

from typing import Sequence

from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.control import ControlClient
from hivemind.utils.multiaddr import Multiaddr


class HivemindChanged(RuntimeError):
    """hivemind no longer has what this module uses: pin the version that has it, or port the use."""


def _daemon_client(p2p: P2P):
    client = getattr(p2p, "_client", None)
    if client is None or not callable(getattr(client, "connect", None)) or not callable(
            getattr(client, "disconnect", None)):
        raise HivemindChanged("hivemind's P2P has no _client with connect and disconnect (cotrain.hivemind_private)")
    return client


async def connect(p2p: P2P, peer: PeerID, maddrs: Sequence[Multiaddr]) -> None:
    """Open a connection to ``peer`` at one of ``maddrs``; raises what the daemon raises when it cannot."""
    await _daemon_client(p2p).connect(peer, list(maddrs))


async def disconnect(p2p: P2P, peer: PeerID) -> None:
    await _daemon_client(p2p).disconnect(peer)


def forget_finished_handlers() -> None:
    """Make hivemind's daemon client forget a served request's task however the handler ends (returned, raised,
    cancelled, or refused for an unknown protocol). Idempotent."""
    original = getattr(ControlClient, "_handle_persistent_request", None)
    if original is None or not hasattr(ControlClient, "__init__"):
        raise HivemindChanged("hivemind's ControlClient has no _handle_persistent_request (cotrain.hivemind_private)")
    if getattr(original, "forgets_finished", False):
        return

    async def handle(self, call_id, request):
        try:
            await original(self, call_id, request)
        finally:
            self._handler_tasks.pop(call_id, None)

    handle.forgets_finished = True
    ControlClient._handle_persistent_request = handle


forget_finished_handlers()
