"""The serving side of the exchange (:class:`~cotrain.averaging.exchange.Exchange`): the pieces this peer publishes,
answered to its groupmates' requests on the exchange's event loop; the states it builds on demand for joiners; who
asked for what, and what peers left with their requests while they wait (:mod:`cotrain.averaging.outbox`). Only
members are served: every request's credential is checked against the peer id libp2p authenticated for it. Every
byte served, and every byte a peer left here, is counted."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional

from hivemind.p2p import P2PContext

from cotrain.averaging.admission import Admission
from cotrain.averaging.outbox import Askers, DepositBox, Outbox
from cotrain.outage import Outage
from cotrain.ratelimit import UploadLimiter
from cotrain.v1 import swarm_pb2 as pb

logger = logging.getLogger("cotrain.averaging.exchange")

CHUNK_BYTES = 1 << 18  # hivemind streams parts of at most 512 KiB itself; stay well below
#: the largest piece sent as one answer to one request. For small pieces a unary call costs the daemons about half
#: the CPU of a stream and Python a third (1,000 fetches of 200 bytes on loopback: 0.9 against 1.9 ms of daemon CPU a
#: fetch, 0.4 against 1.5 ms of Python's); a round's meetings and small all-reduce parts are a dozen fetches a peer,
#: and with 4 nodes on 2 cores the CPU they took was the round's time. Per byte the persistent connection costs the
#: daemon more than a stream does, so the two cross near 150 KB (daemon + Python CPU a fetch, unary against stream:
#: 100 KB 3.3 / 4.6 ms, 300 KB 8.2 / 5.6 ms, 1 MB 22 / 12.5 ms): larger pieces stream in chunks, as do state
#: downloads (which report progress)
UNARY_MAX_BYTES = 1 << 17
#: the largest piece a request leaves, and the largest answer to a request that left one: each goes in one message
#: over the daemon's persistent connection (hivemind's limit is 4 MiB a message). A join is one request and one
#: answer, never a stream: a host that has answered has nothing more to serve when it leaves
MAX_DEPOSIT_BYTES = 2 << 20


class Serving:
    """``loop``: the exchange's event loop, where the requests are answered; ``limiter``: every byte served goes
    through it (a volunteer's upload limit). :meth:`start` runs on that loop before the handlers are added."""

    def __init__(self, admission: Admission, loop: asyncio.AbstractEventLoop, keep_tags: int = 4,
                 limiter: Optional[UploadLimiter] = None):
        self.admission, self._loop, self.limiter = admission, loop, limiter
        self.outbox = Outbox(keep_tags)
        self.asked = Askers()
        self.deposit_box = DepositBox()
        #: pieces served, by how they went ("unary" or "stream")
        self.served = {"unary": 0, "stream": 0}
        self.bytes_sent = 0  # averaging pieces served
        self.bytes_received = 0  # what peers left with their requests
        self.state_bytes_sent = 0
        #: requests being answered now (the exchange's shutdown waits for them)
        self.busy = 0
        self._providers: dict[str, Callable[[], Optional[bytes]]] = {}
        #: state builders that failed, by key (logged once per outage)
        self._provider_failures: dict[str, Outage] = {}
        self._published: Optional[asyncio.Condition] = None
        #: requests waiting for a piece to be published (a publish with none waiting wakes nobody's loop)
        self._waiting = 0

    async def start(self) -> None:
        self._published = asyncio.Condition()

    def publish(self, tag: str, key: str, data: bytes, readers: int = 0, settled: bool = True) -> None:
        """Make ``data`` fetchable under ``key``; keys belong to a round's ``tag``, old tags are dropped.
        ``readers``: how many groupmates will fetch it (an all-reduce's pieces), so that :meth:`shutdown` waits for
        exactly those reads; 0 for pieces nobody must have (a meeting's: a groupmate that misses it just fails to
        meet). ``settled``: whether it answers the requests that leave a deposit and come after it (see
        :meth:`join`); False for an answer that a later one replaces (a host's roster of a meeting that did not fill:
        a peer that joins after it waits for the next)."""
        self.outbox.publish(tag, key, data, readers, settled)
        if self._waiting:  # read after the piece went in: a request that starts waiting now finds it there
            asyncio.run_coroutine_threadsafe(self._notify(), self._loop)

    def withdraw(self, key: str) -> None:
        """Stop serving ``key`` (a meeting that did not fill): requests wait for its next piece, as if none had been."""
        self.outbox.withdraw(key)

    @property
    def reads_awaited(self) -> int:
        """Reads of published pieces that their readers have not made yet (see ``publish(..., readers=)``): a peer
        shutting down waits for these, not for a fixed time."""
        return self.outbox.reads_awaited

    def askers(self, key: str, within_s: float) -> set[str]:
        """The peers (ids) that asked for ``key`` in the last ``within_s`` seconds (whether it was published then
        or not: a peer that asks for a meeting wants to meet). A meeting's host learns at once that a peer waits for
        it (a groupmate, or a peer that walks in), where the board takes reads."""
        return self.asked.within(key, within_s)

    def deposits(self, key: str) -> dict[str, bytes]:
        """The pieces peers left with their requests for ``key`` that still wait for it (peer id -> piece): a meeting's
        members join the host with their meetings, so the host reads them without a request of its own. A piece is
        kept while its request waits, so a peer that gave up (its request timed out, or it went away) is gone here."""
        return self.deposit_box.get(key)

    def wait_deposits(self, seen: int, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for a deposit to be filed or dropped after the ``seen``-th (any key; -1: the
        count now, at once); -> how many there have been."""
        return self.deposit_box.wait(seen, timeout)

    @property
    def max_deposit_bytes(self) -> int:
        """The largest piece a peer may leave with a request (0: none taken); its owner sets it to the largest it
        reads."""
        return self.deposit_box.max_bytes

    @max_deposit_bytes.setter
    def max_deposit_bytes(self, value: int) -> None:
        self.deposit_box.max_bytes = value

    @property
    def deposits_refused(self) -> int:
        """Pieces peers tried to leave that were not kept (too large, or too many at once)."""
        return self.deposit_box.refused

    def provide(self, key: str, make: Callable[[], Optional[bytes]]) -> None:
        """Serve ``key`` by calling ``make()`` (in a worker thread) on every request: for data built on demand,
        such as the current shared state a joining peer downloads. ``make`` may return None (nothing to give)."""
        self._providers[key] = make

    async def _notify(self):
        async with self._published:
            self._published.notify_all()

    def _refusal(self, request: pb.FetchRequest, context: P2PContext) -> Optional[str]:
        """Why this request is refused (its credential does not admit the peer libp2p authenticated); None: serve."""
        what = "a state download" if request.key in self._providers else "an all-reduce piece"
        verdict = self.admission.check(request.credential, str(context.remote_id), what)
        return None if verdict.ok else verdict.reason

    async def serve(self, request: pb.FetchRequest, context: P2PContext):
        refused = self._refusal(request, context)
        if refused is not None:
            yield pb.FetchChunk(found=False, refused=refused)
            return
        self.busy += 1
        try:
            if request.key not in self._providers:
                self.asked.note(request.key, str(context.remote_id))
            async for chunk in self._serve_chunks(request):
                yield chunk
        finally:
            self.busy -= 1

    async def serve_unary(self, request: pb.FetchRequest, context: P2PContext) -> pb.FetchChunk:
        """A piece as one answer; one built on demand (a state) or larger than ``UNARY_MAX_BYTES`` is to be streamed."""
        refused = self._refusal(request, context)
        if refused is not None:
            return pb.FetchChunk(found=False, refused=refused)
        if request.key in self._providers:
            return pb.FetchChunk(found=True, use_stream=True)
        peer = str(context.remote_id)
        self.asked.note(request.key, peer)
        deposit = request.deposit  # one object: protobuf hands out a new one at every read
        filed, after = None, None
        if deposit:  # kept while the request waits for its answer, which is a piece published since
            self.bytes_received += len(deposit)
            # taken before the deposit shows: an answer published as soon as it does still counts
            after = self.outbox.version(request.key)
            if not self.deposit_box.file(request.key, peer, deposit):
                return pb.FetchChunk(found=False)
            filed = deposit
        self.busy += 1
        try:
            data = await self._published_piece(request.key, request.wait_s, after)
            if data is None:
                return pb.FetchChunk(found=False)
            if len(data) > (MAX_DEPOSIT_BYTES if filed is not None else UNARY_MAX_BYTES):
                return pb.FetchChunk(found=True, total=len(data), use_stream=True)
            if self.limiter is not None:
                await self.limiter.take(len(data))
            self.bytes_sent += len(data)
            self.served["unary"] += 1
            self.outbox.was_read(request.key)
            return pb.FetchChunk(data=data, found=True, total=len(data))
        finally:
            self.busy -= 1
            if filed is not None:
                self.deposit_box.drop(request.key, peer, filed)

    async def _published_piece(self, key: str, wait_s: float, after: Optional[int] = None) -> Optional[bytes]:
        """The piece under ``key``, waiting up to ``wait_s`` (at most 600 s) for it to be published. ``after``: only a
        piece published after the ``after``-th under the key, or a settled one, answers (None: any)."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), 600.0)

        def ready() -> bool:
            return self.outbox.piece(key, after) is not None

        self._waiting += 1  # before looking: a publish after the look sees it and wakes us
        try:
            async with self._published:
                while not ready() and time.monotonic() < deadline:
                    try:
                        await asyncio.wait_for(self._published.wait(),
                                               timeout=max(0.0, deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        break
        finally:
            self._waiting -= 1
        return self.outbox.piece(key, after)

    async def _serve_chunks(self, request: pb.FetchRequest):
        if request.key in self._providers:
            failures = self._provider_failures.setdefault(request.key,
                                                          Outage(f"building {request.key} for peers", logger))
            try:
                data = await asyncio.get_running_loop().run_in_executor(None, self._providers[request.key])
                failures.succeeded()
            except Exception as e:  # noqa: BLE001 - whatever it is, the peer gets "not found" and the operator a log
                failures.failed(e, expected=False, action="answering 'not found'")
                data = None
            async for chunk in self._chunks(data, state=True):
                yield chunk
            return
        data = await self._published_piece(request.key, request.wait_s)
        async for chunk in self._chunks(data):
            yield chunk
        if data is not None:  # the last chunk went out (a reader that went away closed the stream before)
            self.outbox.was_read(request.key)

    async def _chunks(self, data: Optional[bytes], state: bool = False):
        if data is None:
            yield pb.FetchChunk(found=False)
            return
        if not state:
            self.served["stream"] += 1
        for start in range(0, max(len(data), 1), CHUNK_BYTES):
            piece = data[start: start + CHUNK_BYTES]
            if self.limiter is not None:
                await self.limiter.take(len(piece))
            if state:
                self.state_bytes_sent += len(piece)
            else:
                self.bytes_sent += len(piece)
            yield pb.FetchChunk(data=piece, found=True, total=len(data) if start == 0 else 0)
