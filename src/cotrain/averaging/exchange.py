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

from google.protobuf.message import DecodeError
from hivemind.dht import DHT
from hivemind.p2p import P2P, P2PContext, P2PDaemonError, P2PHandlerError, PeerID
from hivemind.utils.multiaddr import Multiaddr

from cotrain.averaging.admission import Admission
from cotrain.averaging.outbox import Askers, DepositBox, Outbox
from cotrain.outage import Outage
from cotrain.ratelimit import UploadLimiter
from cotrain.v1 import swarm_pb2 as pb
from cotrain import hivemind_private  # noqa: F401 - importing it mends hivemind's handler-task leak

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 18  # hivemind streams parts of at most 512 KiB itself; stay well below
#: the largest piece sent as one answer to one request. For small pieces a unary call costs the daemons about half
#: the CPU of a stream and Python a third (1,000 fetches of 200 bytes on loopback: 0.9 against 1.9 ms of daemon CPU a
#: fetch, 0.4 against 1.5 ms of Python's); a round's meetings and small all-reduce parts are a dozen fetches a peer,
#: and with 4 nodes on 2 cores the CPU they took was the round's time. Per byte the persistent connection costs the
#: daemon more than a stream does, so the two cross near 150 KB (daemon + Python CPU a fetch, unary against stream:
#: 100 KB 3.3 / 4.6 ms, 300 KB 8.2 / 5.6 ms, 1 MB 22 / 12.5 ms): larger pieces stream in chunks, as do state
#: downloads (which report progress)
UNARY_MAX_BYTES = 1 << 17
#: what talking to a peer raises when the peer died, its daemon refused, or the stream broke or came garbled: part of
#: a swarm's life (the piece is missing, the round goes on without it), not a fault of this peer's
PEER_ERRORS = (P2PDaemonError, P2PHandlerError, OSError, EOFError, DecodeError)
#: the largest piece a request leaves, and the largest answer to a request that left one: each goes in one message
#: over the daemon's persistent connection (hivemind's limit is 4 MiB a message). A join is one request and one
#: answer, never a stream: a host that has answered has nothing more to serve when it leaves
MAX_DEPOSIT_BYTES = 2 << 20


def _oversized(size: int, max_bytes: Optional[int]) -> bool:
    return max_bytes is not None and size > max_bytes


async def _daemon_listen_maddr(_dht: DHT, node) -> Multiaddr:
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
        #: the pieces this peer serves, who asked for them, and what peers left with their requests
        self.outbox = Outbox(keep_tags)
        self.asked = Askers()
        self.deposit_box = DepositBox()
        #: pieces served, by how they went ("unary" or "stream")
        self.served = {"unary": 0, "stream": 0}
        self.bytes_sent = 0
        self.bytes_received = 0
        self.state_bytes_sent = 0
        self.state_bytes_received = 0
        self._providers: dict[str, Callable[[], Optional[bytes]]] = {}
        self._serving = 0
        self._last_refused_log = 0.0
        #: state builders that failed, by key (logged once per outage); fetches that failed in a way no dying peer
        #: explains, by kind of error (the first of each kind is logged with its traceback)
        self._provider_failures: dict[str, Outage] = {}
        self.unexpected_fetch_errors: dict[str, int] = {}
        #: requests of ours that peers refused (our credential expired or was revoked: we are not a member)
        self.refusals_received = 0
        #: pieces peers offered that were larger than the fetch's ``max_bytes`` (not taken in)
        self.oversized_pieces = 0
        self._last_oversized_log = 0.0
        self._loop = asyncio.new_event_loop()
        self._published: Optional[asyncio.Condition] = None
        #: requests waiting for a piece to be published (a publish with none waiting wakes nobody's loop)
        self._waiting = 0
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"exchange-{namespace}", daemon=True)
        self._thread.start()
        self.p2p = self._run(self._start(dht), timeout=60)
        self.peer_id: PeerID = self.p2p.peer_id

    def _run(self, coro, timeout: Optional[float] = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self, dht: DHT):
        self._published = asyncio.Condition()
        # a replica of our own, made on this loop: hivemind's dht.replicate_p2p() hands every caller in a process
        # the same one, whose persistent connection to the daemon (unary calls and handlers) lives on the loop of
        # whoever made it first; a second exchange on the same DHT waited on it forever
        p2p = await P2P.replicate(dht.run_coroutine(_daemon_listen_maddr))
        await p2p.add_protobuf_handler(self.handler_name, self._serve, pb.FetchRequest, stream_output=True)
        await p2p.add_protobuf_handler(self.unary_name, self._serve_unary, pb.FetchRequest)
        return p2p

    # ---- serving -------------------------------------------------------------------------------------------------
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

    async def _serve(self, request: pb.FetchRequest, context: P2PContext):
        refused = self._refusal(request, context)
        if refused is not None:
            yield pb.FetchChunk(found=False, refused=refused)
            return
        self._serving += 1
        try:
            if request.key not in self._providers:
                self.asked.note(request.key, str(context.remote_id))
            async for chunk in self._serve_chunks(request):
                yield chunk
        finally:
            self._serving -= 1

    async def _serve_unary(self, request: pb.FetchRequest, context: P2PContext) -> pb.FetchChunk:
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
        self._serving += 1
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
            self._serving -= 1
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

    # ---- fetching ------------------------------------------------------------------------------------------------
    async def _fetch(self, peer: PeerID, key: str, wait_s: float,
                     on_progress: Optional[Callable[[int, int], None]] = None, state: bool = False,
                     large: bool = False, max_bytes: Optional[int] = None, deposit: bytes = b"") -> Optional[bytes]:
        """A piece, or None. An all-reduce piece is asked for in one request first; the answer is the piece, or that
        it is to be streamed (it is large). States, and pieces the caller expects to be ``large`` (more than
        ``UNARY_MAX_BYTES``), stream at once. A piece of more than ``max_bytes`` (as the peer announces it, or as
        it comes) is none: it is not taken in. ``deposit``: left with the peer while the request waits (see
        :meth:`join`)."""
        request = pb.FetchRequest(key=key, wait_s=wait_s, credential=self.admission.credential())
        if deposit:
            if self.limiter is not None:  # what we leave we upload: under our upload limit
                await self.limiter.take(len(deposit))
            request.deposit = deposit
        if not state and not large and on_progress is None:
            try:
                answer = await self.p2p.call_protobuf_handler(peer, self.unary_name, request, pb.FetchChunk)
                if deposit and not answer.refused:  # it arrived (the peer counts it as it takes it in)
                    self.bytes_sent += len(deposit)
            except P2PDaemonError as e:  # its daemon refused the call (a peer of a version without it): stream
                logger.debug("fetch %s from %s in one request failed: %r; streaming it", key, peer, e)
                if deposit:  # a join is one request: a stream would answer with what was there before it came
                    return None
            except PEER_ERRORS as e:  # the peer died, the connection broke
                logger.debug("fetch %s from %s failed: %r", key, peer, e)
                return None
            except Exception as e:  # noqa: BLE001 - no dying peer explains it: counted, the first of a kind logged
                self._unexpected_fetch_error(key, peer, e)
                return None
            else:
                if not answer.use_stream:
                    return self._took_answer(peer, key, answer, max_bytes)
                if _oversized(answer.total, max_bytes):
                    self._oversized(peer, key, answer.total, max_bytes)
                    return None
                request.wait_s = 0.0  # it is published: the stream needs no wait
        request.deposit = b""  # a stream leaves nothing (the answer is there, or the peer streams only)
        return await self._fetch_stream(peer, request, on_progress, state, max_bytes)

    def _oversized(self, peer: PeerID, key: str, size: int, max_bytes: Optional[int]) -> None:
        """A peer offered a piece larger than any the fetch expects: counted, logged at most every 10 s."""
        self.oversized_pieces += 1
        now = time.monotonic()
        if now - self._last_oversized_log >= 10.0:
            self._last_oversized_log = now
            logger.warning("peer ...%s offered %d bytes for %s, more than the %d expected: not taken (%d such so far)",
                           str(peer)[-8:], size, key, max_bytes, self.oversized_pieces)

    def _took_answer(self, peer: PeerID, key: str, answer: pb.FetchChunk,
                     max_bytes: Optional[int] = None) -> Optional[bytes]:
        if not answer.found:
            if answer.refused:
                self._log_refused(peer, answer.refused[:200])
            return None
        if _oversized(len(answer.data), max_bytes):
            self._oversized(peer, key, len(answer.data), max_bytes)
            return None
        if len(answer.data) != answer.total:
            logger.info("fetch %s from %s: got %d of %d bytes", key, str(peer)[-8:], len(answer.data), answer.total)
            return None
        self.bytes_received += len(answer.data)
        return answer.data

    async def _fetch_stream(self, peer: PeerID, request: pb.FetchRequest,
                            on_progress: Optional[Callable[[int, int], None]], state: bool,
                            max_bytes: Optional[int] = None) -> Optional[bytes]:
        key = request.key
        pieces: list[bytes] = []  # joined once at the end: one copy of the piece, not one per chunk
        size = total = 0
        try:
            stream = await self.p2p.iterate_protobuf_handler(peer, self.handler_name, request, pb.FetchChunk)
            async for chunk in stream:
                if not chunk.found:
                    if chunk.refused:
                        self._log_refused(peer, chunk.refused[:200])
                    return None
                pieces.append(chunk.data)
                size += len(chunk.data)
                total = total or chunk.total
                if _oversized(total, max_bytes):
                    self._oversized(peer, key, total, max_bytes)
                    return None
                if state:
                    self.state_bytes_received += len(chunk.data)
                else:
                    self.bytes_received += len(chunk.data)
                if size > total:  # more than the peer announced: not a piece of ours (no end to it otherwise)
                    logger.info("fetch %s from %s: more than the %d bytes announced", key, str(peer)[-8:], total)
                    return None
                if on_progress is not None:
                    on_progress(size, total)
        except PEER_ERRORS as e:  # the peer died, its daemon refused, the stream broke
            logger.debug("fetch %s from %s failed: %r", key, peer, e)
            return None
        except Exception as e:  # noqa: BLE001 - no dying peer explains it: counted, the first of a kind logged
            self._unexpected_fetch_error(key, peer, e)
            return None
        if not pieces or size != total:
            # the stream closed early (the peer is going away, or the link broke): never hand on a truncated piece
            logger.info("fetch %s from %s: got %d of %d bytes", key, str(peer)[-8:], size, total)
            return None
        return b"".join(pieces)

    def _unexpected_fetch_error(self, key: str, peer: PeerID, error: Exception) -> None:
        kind = type(error).__name__
        self.unexpected_fetch_errors[kind] = self.unexpected_fetch_errors.get(kind, 0) + 1
        if self.unexpected_fetch_errors[kind] == 1:
            logger.warning("fetch %s from ...%s failed with %s (further %s errors are counted, not logged)", key,
                           str(peer)[-8:], kind, kind, exc_info=(type(error), error, error.__traceback__))

    def _log_refused(self, peer: PeerID, reason: str) -> None:
        self.refusals_received += 1
        now = time.monotonic()
        if now - self._last_refused_log >= 10.0:
            self._last_refused_log = now
            logger.warning("peer ...%s refused our request: %s", str(peer)[-8:], reason)

    def fetch_many(self, requests: Sequence[tuple[PeerID, str]], wait_s: float, large: bool = False,
                   max_bytes: Optional[int] = None) -> list[Optional[bytes]]:
        """Fetch every (peer, key) concurrently; None for a piece that did not come within ``wait_s``. ``large``: the
        pieces are expected to be larger than ``UNARY_MAX_BYTES`` (they stream at once; a wrong guess costs only
        speed). ``max_bytes``: the most a piece may hold (None: no bound); a larger one is none, never taken in."""

        async def one(peer: PeerID, key: str) -> Optional[bytes]:
            deadline = time.monotonic() + wait_s
            for attempt in range(3):  # a broken stream is retried while time remains
                data = await self._fetch(peer, key, max(0.0, deadline - time.monotonic()), large=large,
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
                self._unexpected_fetch_error(key, peer, r)
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
            return await self._fetch(peer, key, wait_s, max_bytes=max_bytes, deposit=deposit)

        try:
            return self._run(asyncio.wait_for(one(), timeout=wait_s + 10.0))
        except (asyncio.TimeoutError, TimeoutError):
            return None
        except Exception as e:  # noqa: BLE001 - no dying peer explains it: counted, the first of a kind logged
            self._unexpected_fetch_error(key, peer, e)
            return None

    def fetch(self, peer: PeerID, key: str, wait_s: float, timeout: float,
              on_progress: Optional[Callable[[int, int], None]] = None, state: bool = False) -> Optional[bytes]:
        """One piece from one peer; ``on_progress(received, total)`` after every chunk. ``state``: count the bytes
        as a state download, not as averaging."""
        try:
            return self._run(asyncio.wait_for(self._fetch(peer, key, wait_s, on_progress, state), timeout=timeout))
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
                self._serving > 0 or (self.reads_awaited > 0 and time.monotonic() - started < linger_s)):
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
