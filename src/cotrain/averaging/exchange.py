"""Peer-to-peer exchange of byte strings over hivemind's libp2p daemon: the transport of cotrain's all-reduce.

Every peer publishes pieces under string keys; its groupmates fetch them. A piece of up to ``UNARY_MAX_BYTES``
travels as one request and one answer (``FetchRequest`` -> ``FetchChunk``, a unary call over the persistent
connection each process keeps to its libp2p daemon); larger ones and state downloads as a stream of chunks, which
costs a new connection to the daemon at both ends. A fetch for a piece not published yet waits for it up to
``wait_s``, so peers that reach a phase at slightly different times still meet. A request may leave a piece with the
peer while it waits (:meth:`Exchange.join`: a meeting's member joins its host with its meeting, and the host's roster
comes back on the same request), bounded in size and number. Every byte served and fetched is
counted: these are the bytes the node actually put on, and took off, the wire: ``bytes_sent``/``bytes_received``
for averaging, ``state_bytes_sent``/``state_bytes_received`` for the shared state served to joining peers and the
coordinator's checkpointer.

The exchange runs its own asyncio loop in a background thread of the node process and talks to the libp2p
daemon that the node's DHT started (a client of its own of that daemon): no second daemon, no extra port.

Only members are served: every request carries the requester's credential, and the exchange checks it against
the peer id libp2p authenticated for the connection (:class:`~cotrain.averaging.admission.Admission`). A refused
request gets ``found = false`` with the reason, and is counted.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable, Optional, Sequence

from hivemind.dht import DHT
from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from cotrain.averaging.admission import Admission
from cotrain.averaging.fetching import PEER_ERRORS, Fetcher
from cotrain.averaging.serving import MAX_DEPOSIT_BYTES, UNARY_MAX_BYTES, Serving  # noqa: F401 - re-exported
from cotrain.ratelimit import UploadLimiter
from cotrain.v1 import swarm_pb2 as pb
from cotrain import hivemind_private  # noqa: F401 - importing it mends hivemind's handler-task leak

logger = logging.getLogger(__name__)



async def daemon_listen_maddr(_dht: DHT, node) -> Multiaddr:
    """Where the DHT's libp2p daemon listens for its clients (run in the DHT's process)."""
    return node.p2p.daemon_listen_maddr


class Exchange:
    def __init__(self, dht: DHT, namespace: str, admission: Admission, keep_tags: int = 4,
                 limiter: Optional[UploadLimiter] = None):
        self.namespace = namespace
        self.admission = admission
        self.limiter = limiter  # every byte this peer serves goes through it (a volunteer's upload limit)
        self.handler_name = f"{namespace}.fetch"
        self.unary_name = f"{namespace}.get"
        self._loop = asyncio.new_event_loop()
        #: the pieces this peer serves, who asked for them, and what peers left with their requests
        self.serving = Serving(admission, self._loop, keep_tags, limiter)
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"exchange-{namespace}", daemon=True)
        self._thread.start()
        self.p2p = self._run(self._start(dht), timeout=60)
        self.peer_id: PeerID = self.p2p.peer_id
        #: what this peer asks of others: pieces, states and joins (cotrain.averaging.fetching)
        self.fetcher = Fetcher(self.p2p, admission, self.unary_name, self.handler_name, limiter)

    def _run(self, coro, timeout: Optional[float] = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self, dht: DHT):
        await self.serving.start()
        # a replica of our own, made on this loop: hivemind's dht.replicate_p2p() hands every caller in a process
        # the same one, whose persistent connection to the daemon (unary calls and handlers) lives on the loop of
        # whoever made it first; a second exchange on the same DHT waited on it forever
        p2p = await P2P.replicate(dht.run_coroutine(daemon_listen_maddr))
        await p2p.add_protobuf_handler(self.handler_name, self.serving.serve, pb.FetchRequest, stream_output=True)
        await p2p.add_protobuf_handler(self.unary_name, self.serving.serve_unary, pb.FetchRequest)
        return p2p

    # ---- serving: what Serving does, for the callers that know the exchange -----------------------------------
    def publish(self, tag: str, key: str, data: bytes, readers: int = 0, settled: bool = True) -> None:
        self.serving.publish(tag, key, data, readers, settled)

    def withdraw(self, key: str) -> None:
        self.serving.withdraw(key)

    @property
    def reads_awaited(self) -> int:
        return self.serving.reads_awaited

    def askers(self, key: str, within_s: float) -> set[str]:
        return self.serving.askers(key, within_s)

    def deposits(self, key: str) -> dict[str, bytes]:
        return self.serving.deposits(key)

    def wait_deposits(self, seen: int, timeout: float) -> int:
        return self.serving.wait_deposits(seen, timeout)

    @property
    def max_deposit_bytes(self) -> int:
        return self.serving.deposit_box.max_bytes

    @max_deposit_bytes.setter
    def max_deposit_bytes(self, value: int) -> None:
        self.serving.deposit_box.max_bytes = value

    @property
    def deposits_refused(self) -> int:
        return self.serving.deposit_box.refused

    def provide(self, key: str, make: Callable[[], Optional[bytes]]) -> None:
        self.serving.provide(key, make)

    # ---- what went over the wire ---------------------------------------------------------------------------------
    @property
    def bytes_sent(self) -> int:
        """Averaging bytes this peer put on the wire: the pieces it served, and what it left with its requests."""
        return self.serving.bytes_sent + self.fetcher.deposits_sent

    @property
    def bytes_received(self) -> int:
        """Averaging bytes it took off the wire: the pieces it fetched, and what peers left with theirs."""
        return self.serving.bytes_received + self.fetcher.bytes_received

    @property
    def state_bytes_sent(self) -> int:
        return self.serving.state_bytes_sent

    @property
    def state_bytes_received(self) -> int:
        return self.fetcher.state_bytes_received

    @property
    def refusals_received(self) -> int:
        """Requests of ours that peers refused (our credential expired or was revoked: we are not a member)."""
        return self.fetcher.refusals_received

    @property
    def oversized_pieces(self) -> int:
        """Pieces peers offered that were larger than a fetch's ``max_bytes`` (not taken in)."""
        return self.fetcher.oversized_pieces

    @property
    def served(self) -> dict:
        """Pieces served, by how they went ("unary" or "stream")."""
        return self.serving.served

    # ---- fetching ------------------------------------------------------------------------------------------------
    def fetch_many(self, requests: Sequence[tuple[PeerID, str]], wait_s: float, large: bool = False,
                   max_bytes: Optional[int] = None) -> list[Optional[bytes]]:
        """Fetch every (peer, key) concurrently; None for a piece that did not come within ``wait_s``. ``large``: the
        pieces are expected to be larger than ``UNARY_MAX_BYTES`` (they stream at once; a wrong guess costs only
        speed). ``max_bytes``: the most a piece may hold (None: no bound); a larger one is none, never taken in."""

        async def one(peer: PeerID, key: str) -> Optional[bytes]:
            deadline = time.monotonic() + wait_s
            for attempt in range(3):  # a broken stream is retried while time remains
                data = await self.fetcher.fetch(peer, key, max(0.0, deadline - time.monotonic()), large=large,
                                         max_bytes=max_bytes)
                if data is not None or time.monotonic() >= deadline:
                    return data
                await asyncio.sleep(0.2 * (attempt + 1))
            return None

        async def gather():
            tasks = [asyncio.wait_for(one(peer, key), timeout=wait_s + 10.0) for peer, key in requests]
            return await asyncio.gather(*tasks, return_exceptions=True)

        results = self._run(gather())
        for (peer, key), r in zip(requests, results):
            if isinstance(r, Exception) and not isinstance(r, asyncio.TimeoutError):  # a timeout: the piece is late
                self.fetcher.unexpected(key, peer, r)
        return [r if isinstance(r, bytes) else None for r in results]

    def join(self, peer: PeerID, key: str, deposit: bytes, wait_s: float,
             max_bytes: Optional[int] = None) -> Optional[bytes]:
        """Leave ``deposit`` with ``peer`` under ``key`` and wait, in the same request, for the piece it publishes
        there next (or a settled one it has; see :meth:`publish`): a meeting's member joins its host with its
        meeting and gets the host's roster back, one request a member and a round, which the host never dials.
        -> the answer, or None when none came within ``wait_s`` (the peer is not there, it refused the deposit, or
        it published nothing new in time). ``deposit`` and the answer each go in one message (at most
        ``MAX_DEPOSIT_BYTES``); a larger deposit is not sent."""
        if not deposit or len(deposit) > MAX_DEPOSIT_BYTES:
            return None

        async def one() -> Optional[bytes]:
            return await self.fetcher.fetch(peer, key, wait_s, max_bytes=max_bytes, deposit=deposit)

        try:
            return self._run(asyncio.wait_for(one(), timeout=wait_s + 10.0))
        except (asyncio.TimeoutError, TimeoutError):
            return None
        except Exception as e:  # noqa: BLE001 - no dying peer explains it: counted, the first of a kind logged
            self.fetcher.unexpected(key, peer, e)
            return None

    def fetch(self, peer: PeerID, key: str, wait_s: float, timeout: float,
              on_progress: Optional[Callable[[int, int], None]] = None, state: bool = False) -> Optional[bytes]:
        """One piece from one peer; ``on_progress(received, total)`` after every chunk. ``state``: count the bytes
        as a state download, not as averaging."""
        try:
            return self._run(asyncio.wait_for(self.fetcher.fetch(peer, key, wait_s, on_progress, state), timeout=timeout))
        except (asyncio.TimeoutError, TimeoutError):
            return None

    def shutdown(self, linger_s: float = 2.0) -> None:
        """Stop serving; first let groupmates fetch this peer's last pieces: while a fetch is being served, and while
        pieces published with ``readers`` have reads to come, up to ``linger_s`` (a groupmate that left the round
        never reads; raise it on links where a piece takes longer to go out). Counted from now, not from when the
        piece was published: a groupmate whose own part of the all-reduce came last (a straggler under load) asks
        for ours only after that, and a peer that waited for its part longer than ``linger_s`` used to leave at
        once, its last reduced part unread (the groupmate's round failed, and it averaged alone)."""
        started = time.monotonic()
        while time.monotonic() < started + 10.0 and (
                self.serving.busy > 0 or (self.reads_awaited > 0 and time.monotonic() - started < linger_s)):
            time.sleep(0.05)

        async def stop():
            try:
                await self.p2p.remove_protobuf_handler(self.handler_name, stream_output=True)
                await self.p2p.remove_protobuf_handler(self.unary_name)
                await self.p2p.shutdown()  # a replica: closes its connections, the DHT's daemon lives on
            except PEER_ERRORS as e:  # the daemon is gone already (the DHT shut down first): nothing left to close
                logger.debug("exchange %s: closing the p2p replica: %r", self.namespace, e)
            except Exception as e:  # noqa: BLE001 - shutting down goes on; the operator hears of it
                logger.warning("exchange %s: closing the p2p replica failed: %r", self.namespace, e)
            current = asyncio.current_task()
            pending = [t for t in asyncio.all_tasks() if t is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        try:
            self._run(stop(), timeout=5)
        except Exception as e:  # noqa: BLE001 - the loop is stopped below either way
            logger.warning("exchange %s: shutdown did not finish cleanly: %r", self.namespace, e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
