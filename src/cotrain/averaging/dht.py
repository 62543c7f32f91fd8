"""Starting a hivemind DHT peer without its process-wide side effects."""

from __future__ import annotations

import signal
from typing import Sequence

from hivemind.dht import DHT


def start_dht(initial_peers: Sequence[str] = (), host: str = "127.0.0.1", port: int = 0,
              client_mode: bool = False, identity_path: str | None = None, announce: Sequence[str] = ()) -> DHT:
    """Start a DHT peer listening on ``host:port`` (port 0: any free port) and joined to ``initial_peers``.

    ``client_mode``: the peer makes outgoing connections only (a volunteer behind NAT); hivemind's optimizer and
    averagers take it from here, not from their own arguments. ``identity_path``: a file holding this peer's
    private key, so that a restarted node keeps its peer id (created when missing). Peers started in one process
    need distinct identities, otherwise they share one key. ``announce``: multiaddrs to tell peers instead of the
    listening ones (a public address behind port forwarding or a cloud load balancer).
    """
    handler = signal.getsignal(signal.SIGINT)
    kwargs = {}
    if identity_path is not None:
        kwargs["identity_path"] = identity_path
    if announce:
        kwargs["announce_maddrs"] = list(announce)
    dht = DHT(
        initial_peers=list(initial_peers),
        host_maddrs=[f"/ip4/{host}/tcp/{port}"],
        client_mode=client_mode,
        start=True,
        **kwargs,
    )
    signal.signal(signal.SIGINT, handler)
    return dht


def visible_maddrs(dht: DHT) -> list[str]:
    return [str(m) for m in dht.get_visible_maddrs()]
