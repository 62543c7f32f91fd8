"""Downloading the swarm's shared state from the peer with the most progress, over the :class:`Exchange`.

A peer serves its current shared state (parameters plus the strategy's state, as a checkpoint-format byte string)
under one key; a joining peer picks donors from the progress board, most rounds first, and streams the state from
the first that answers, reporting progress as chunks arrive.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional, Sequence

from hivemind.p2p import PeerID

from cotrain.averaging.exchange import Exchange
from cotrain.averaging.progress import PeerProgress
from cotrain.checkpoint import Checkpoint, CheckpointError, decode_checkpoint

logger = logging.getLogger(__name__)

STATE_KEY = "state"

Progress = Callable[[int, int], None]


def pick_donors(now: float, me: str, peers: Sequence[PeerProgress], stale_after: float) -> list[PeerProgress]:
    """Live peers other than ``me``, the most progress first (round, then samples in the round)."""
    live = [p for p in peers if p.peer_id != me and p.phase != "left" and now - p.time <= stale_after]
    return sorted(live, key=lambda p: (p.round, p.samples), reverse=True)


def download_state(exchange: Exchange, donors: Sequence[PeerProgress], timeout: float,
                   on_progress: Optional[Progress] = None, run_id: Optional[str] = None) -> Optional[tuple[Checkpoint, str]]:
    """The state of the first donor that sends a valid one, and who it was; None when none did."""
    for donor in donors:
        started = time.monotonic()
        try:
            peer = PeerID.from_base58(donor.peer_id)
        except ValueError:  # records were checked when read; a malformed id here is a bug worth seeing
            logger.warning("donor %r has no valid peer id; trying the next", donor.peer_id[:64])
            continue
        data = exchange.fetch(peer, STATE_KEY, wait_s=0.0, timeout=timeout, on_progress=on_progress, state=True)
        if not data:
            logger.info("peer %s sent no state; trying the next", donor.peer_id[-8:])
            continue
        try:
            ckpt = decode_checkpoint(data, origin=f"state from peer {donor.peer_id[-8:]}")
        except CheckpointError as e:
            logger.warning("%s", e)
            continue
        if run_id is not None and ckpt.metadata.get("run_id") != run_id:
            logger.warning("peer %s sent the state of another run; ignored", donor.peer_id[-8:])
            continue
        logger.info("downloaded %d bytes of state (round %s) from peer %s in %.1fs", len(data),
                    ckpt.metadata.get("round"), donor.peer_id[-8:], time.monotonic() - started)
        return ckpt, donor.peer_id
    return None
