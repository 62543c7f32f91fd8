"""Can other peers dial a node? The coordinator tries, so that a volunteer behind NAT need not know it is.

A node behind NAT (or a firewall, or listening on its own loopback) announces addresses nobody can reach; peers
that try them waste their rounds' time on dials that never connect. When a node registers its DHT peer, the
coordinator dials the addresses it announces from a libp2p daemon of its own that nobody else knows (so a
connection the node itself opened earlier cannot answer for it), checking the peer id at the other end. A node that
cannot be dialled is told so and restarts its DHT peer in client mode: it dials out to its peers and averages over
those connections.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional, Sequence

from hivemind.p2p import P2P, P2PDaemonError, PeerID
from hivemind.utils.multiaddr import Multiaddr

from cotrain import hivemind_private
from cotrain.protocol import DIAL_OUT_ONLY, PUBLIC

logger = logging.getLogger(__name__)

#: seconds the coordinator spends dialling one node; a reachable peer answers within a round trip or two, an
#: unreachable address usually hangs (a dropped SYN) until this passes. Raise it for coordinators far from their
#: volunteers (satellite links: 10 s).
DIAL_TIMEOUT_S = 5.0
MAX_MADDRS = 16
MAX_MADDR_LEN = 256


class InvalidPeer(ValueError):
    pass


def parse_peer(peer_id: str, maddrs: Sequence[str]) -> tuple[PeerID, list[Multiaddr]]:
    """A node's claimed peer id and announced addresses, checked; InvalidPeer names the bad field."""
    if not peer_id or len(peer_id) > 128:
        raise InvalidPeer("peer_id: must be a base58 libp2p peer id of at most 128 characters")
    try:
        peer = PeerID.from_base58(peer_id)
    except Exception:  # noqa: BLE001 - base58/multihash errors of several kinds
        raise InvalidPeer("peer_id: not a base58 libp2p peer id") from None
    if len(maddrs) > MAX_MADDRS:
        raise InvalidPeer(f"maddrs: at most {MAX_MADDRS} addresses")
    parsed = []
    for m in maddrs:
        if len(m) > MAX_MADDR_LEN:
            raise InvalidPeer(f"maddrs: an address longer than {MAX_MADDR_LEN} characters")
        try:
            parsed.append(Multiaddr(m.split("/p2p/")[0]))
        except Exception:  # noqa: BLE001
            raise InvalidPeer(f"maddrs: {m[:80]!r} is not a multiaddr") from None
    return peer, parsed


def reachability_decision(client_mode: bool, dialled: Optional[bool], why: str) -> tuple[str, str]:
    """The node's reachability and the reason, from whether it asked for client mode and how the dial went."""
    if client_mode:
        return DIAL_OUT_ONLY, "the node runs in client mode"
    if dialled:
        return PUBLIC, f"the coordinator dialled it ({why})"
    return DIAL_OUT_ONLY, f"the coordinator could not dial it ({why}): it should run in client mode"


class Prober:
    """A dial-only libp2p daemon of the coordinator's (started on first use, on the caller's event loop)."""

    def __init__(self, timeout: float = DIAL_TIMEOUT_S):
        self.timeout = timeout
        self._p2p: Optional[P2P] = None
        self._lock: Optional[asyncio.Lock] = None

    async def _daemon(self) -> P2P:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._p2p is None:
                self._p2p = await P2P.create(host_maddrs=[], no_listen=True, use_relay=False, auto_nat=False,
                                             nat_port_map=False, dht_mode="client")
        return self._p2p

    async def dial(self, peer: PeerID, maddrs: Sequence[Multiaddr]) -> tuple[bool, str]:
        """(True, how) when a connection to ``peer`` at one of ``maddrs`` opens within the timeout."""
        if not maddrs:
            return False, "it announced no address"
        p2p = await self._daemon()
        try:
            await asyncio.wait_for(hivemind_private.connect(p2p, peer, maddrs), timeout=self.timeout)
        except asyncio.TimeoutError:
            return False, f"no answer within {self.timeout:.0f}s at {', '.join(map(str, maddrs))}"
        except Exception as e:  # noqa: BLE001 - the daemon reports refusals and peer-id mismatches as errors
            return False, f"{str(e)[:200] or type(e).__name__} at {', '.join(map(str, maddrs))}"
        try:
            await hivemind_private.disconnect(p2p, peer)
        except (P2PDaemonError, OSError, asyncio.TimeoutError) as e:  # an idle connection is closed by the daemon anyway
            logger.debug("could not close the probe connection to %s: %r", peer, e)
        return True, f"connected at {', '.join(map(str, maddrs))}"

    async def shutdown(self) -> None:
        if self._p2p is not None:
            await self._p2p.shutdown()
            self._p2p = None
