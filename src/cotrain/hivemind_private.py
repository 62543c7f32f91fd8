"""The one place cotrain uses hivemind's private API, each use checked by tests/test_hivemind_private.py, which
fails when a hivemind release changes it.

- ``P2P._client``: the libp2p daemon's client. hivemind's public P2P API opens streams to a peer it already
  knows, but has no call that dials a peer at given addresses and reports whether the connection opened, which is
  what the coordinator's reachability check needs (coordinator/reachability.py).
"""

from __future__ import annotations

from typing import Sequence

from hivemind.p2p import P2P, PeerID
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
