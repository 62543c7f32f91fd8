"""The swarm's shared state: its hash, and downloading it from the peer with the most progress over the
:class:`Exchange`.

A peer serves its current shared state (parameters plus the strategy's state, as a checkpoint-format byte string)
under one key; a joining peer picks donors from the progress board, most rounds first, and streams the state from
the first that answers, reporting progress as chunks arrive.

Peers compare hashes of their shared states when a group forms (a peer whose state differs from the group's
majority downloads the state). :class:`StateHash` computes the hash on a thread of its own after each change, while
the node takes its next local step.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional, Sequence

import torch
from hivemind.p2p import PeerID

from cotrain.averaging.exchange import Exchange
from cotrain.averaging.progress import Phase, PeerProgress
from cotrain.checkpoint import Checkpoint, CheckpointError, decode_checkpoint

logger = logging.getLogger(__name__)

STATE_KEY = "state"

Progress = Callable[[int, int], None]


def state_hash(tensors: Sequence[torch.Tensor]) -> str:
    """A short hash of the tensors' bytes, in order (hashed in place: no copy of a tensor on the CPU)."""
    digest = hashlib.sha1()
    for t in tensors:
        digest.update(memoryview(t.detach().cpu().contiguous().reshape(-1).numpy()).cast("B"))
    return digest.hexdigest()[:16]


class StateHash:
    """The hash of a shared state that changes between rounds, computed on a thread of its own.

    :meth:`update` starts hashing the state as it is now; :meth:`value` waits for the latest hash. The caller must
    not change the tensors while a hash of them runs: it calls :meth:`value` (or :meth:`settle`) first. hashlib
    lets go of the GIL while it hashes, so the node's next local step runs meanwhile: sync rounds hash the
    parameters and the optimizer's state after every step (10 MB for the BASELINES LSTM, 6 ms alone and 16 ms
    among three nodes on 2 cores: 4.5% of the training loop when the main thread did it)."""

    #: a state of up to this many bytes is hashed at once, on the caller's thread: handing it to the thread cost more
    #: than hashing it (a 0.1 MB state at 8 nodes on 2 cores, ten rounds a second: the hand-over was 7% of a node's
    #: Python time in py-spy, the hash itself 2%)
    INLINE_BYTES = 1 << 20

    def __init__(self, tensors: Sequence[torch.Tensor]):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="state-hash")
        self._future: Future = Future()
        self._future.set_result("")
        self.update(tensors)

    def update(self, tensors: Sequence[torch.Tensor]) -> None:
        tensors = list(tensors)
        if sum(t.numel() * t.element_size() for t in tensors) <= self.INLINE_BYTES:
            self.settle()  # a hash still running (of a large state before) finishes first: hashes come in order
            done: Future = Future()
            done.set_result(state_hash(tensors))
            self._future = done
            return
        # no wait here: the caller settled before changing the tensors, and the one thread hashes in order
        self._future = self._pool.submit(state_hash, tensors)

    def settle(self) -> None:
        """Wait until no hash runs: the tensors may change."""
        self.value()

    def value(self) -> str:
        return self._future.result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


def pick_donors(now: float, me: str, peers: Sequence[PeerProgress], stale_after: float) -> list[PeerProgress]:
    """Live peers other than ``me``, the most progress first (round, then samples in the round)."""
    live = [p for p in peers if p.peer_id != me and p.phase != Phase.LEFT and now - p.time <= stale_after]
    return sorted(live, key=lambda p: (p.round, p.samples), reverse=True)


def download_state(exchange: Exchange, donors: Sequence[PeerProgress], timeout: float,
                   on_progress: Optional[Progress] = None, run_id: Optional[str] = None) -> Optional[tuple[Checkpoint, str]]:
    """The state of the first donor that sends a valid one, and who it was; None when none did. ``donors``: their
    progress records, or their peer ids."""
    for record in donors:
        donor = record if isinstance(record, str) else record.peer_id
        started = time.monotonic()
        try:
            peer = PeerID.from_base58(donor)
        except ValueError:  # records were checked when read; a malformed id here is a bug worth seeing
            logger.warning("donor %r has no valid peer id; trying the next", donor[:64])
            continue
        data = exchange.fetch(peer, STATE_KEY, wait_s=0.0, timeout=timeout, on_progress=on_progress, state=True)
        if not data:
            logger.info("peer %s sent no state; trying the next", donor[-8:])
            continue
        try:
            ckpt = decode_checkpoint(data, origin=f"state from peer {donor[-8:]}")
        except CheckpointError as e:
            logger.warning("%s", e)
            continue
        if run_id is not None and ckpt.metadata.get("run_id") != run_id:
            logger.warning("peer %s sent the state of another run; ignored", donor[-8:])
            continue
        logger.info("downloaded %d bytes of state (round %s) from peer %s in %.1fs", len(data),
                    ckpt.metadata.get("round"), donor[-8:], time.monotonic() - started)
        return ckpt, donor
    return None
