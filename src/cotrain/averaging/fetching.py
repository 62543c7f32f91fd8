"""The fetching side of the exchange (cotrain.averaging.exchange): one piece from one peer over hivemind's libp2p
daemon, in one request and one answer while it is small, as a stream of chunks when it is large or a state, with
what it put on and took off the wire counted, and every failure a dying peer explains taken as a missing piece.

Every answer is hostile until checked: a piece larger than the fetch's ``max_bytes`` (as announced, or as it comes)
is never taken in, a stream that brings more than it announced or ends short is none, and a refusal is counted and
logged at most every 10 s.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from google.protobuf.message import DecodeError
from hivemind.p2p import P2P, P2PDaemonError, P2PHandlerError, PeerID

from cotrain.averaging.admission import Admission
from cotrain.ratelimit import UploadLimiter
from cotrain.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)

#: what talking to a peer raises when the peer died, its daemon refused, or the stream broke or came garbled: part of
#: a swarm's life (the piece is missing, the round goes on without it), not a fault of this peer's
PEER_ERRORS = (P2PDaemonError, P2PHandlerError, OSError, EOFError, DecodeError)


def _oversized(size: int, max_bytes: Optional[int]) -> bool:
    return max_bytes is not None and size > max_bytes


class Fetcher:
    """Fetches pieces over ``p2p`` (the exchange's replica of its DHT's daemon) from the handlers ``unary_name``
    (one request, one answer) and ``handler_name`` (a stream), with this peer's credential from ``admission``; what
    it leaves with a request goes through ``limiter``. Runs on the exchange's loop."""

    def __init__(self, p2p: P2P, admission: Admission, unary_name: str, handler_name: str,
                 limiter: Optional[UploadLimiter] = None):
        self.p2p, self.admission, self.limiter = p2p, admission, limiter
        self.unary_name, self.handler_name = unary_name, handler_name
        #: what this peer left with its requests (the exchange's bytes_sent counts it)
        self.deposits_sent = 0
        #: the averaging pieces it fetched (the exchange's bytes_received counts them)
        self.bytes_received = 0
        self.state_bytes_received = 0
        self._last_refused_log = 0.0
        #: fetches that failed in a way no dying peer explains, by kind of error (the first of each kind is logged with
        #: its traceback)
        self.unexpected_errors: dict[str, int] = {}
        #: requests of ours that peers refused (our credential expired or was revoked: we are not a member)
        self.refusals_received = 0
        #: pieces peers offered that were larger than the fetch's ``max_bytes`` (not taken in)
        self.oversized_pieces = 0
        self._last_oversized_log = 0.0

    async def fetch(self, peer: PeerID, key: str, wait_s: float,
                     on_progress: Optional[Callable[[int, int], None]] = None, state: bool = False,
                     large: bool = False, max_bytes: Optional[int] = None, deposit: bytes = b"") -> Optional[bytes]:
        """A piece, or None. An all-reduce piece is asked for in one request first; the answer is the piece, or that
        it is to be streamed (it is large). States, and pieces the caller expects to be ``large`` (more than
        ``UNARY_MAX_BYTES``), stream at once. A piece of more than ``max_bytes`` (as the peer announces it, or as
        it comes) is none: it is not taken in. ``deposit``: left with the peer while the request waits (see
        :meth:`Exchange.join <cotrain.averaging.exchange.Exchange.join>`)."""
        request = pb.FetchRequest(key=key, wait_s=wait_s, credential=self.admission.credential())
        if deposit:
            if self.limiter is not None:  # what we leave we upload: under our upload limit
                await self.limiter.take(len(deposit))
            request.deposit = deposit
        if not state and not large and on_progress is None:
            try:
                answer = await self.p2p.call_protobuf_handler(peer, self.unary_name, request, pb.FetchChunk)
                if deposit and not answer.refused:  # it arrived (the peer counts it as it takes it in)
                    self.deposits_sent += len(deposit)
            except P2PDaemonError as e:  # its daemon refused the call (a peer of a version without it): stream
                logger.debug("fetch %s from %s in one request failed: %r; streaming it", key, peer, e)
                if deposit:  # a join is one request: a stream would answer with what was there before it came
                    return None
            except PEER_ERRORS as e:  # the peer died, the connection broke
                logger.debug("fetch %s from %s failed: %r", key, peer, e)
                return None
            except Exception as e:  # noqa: BLE001 - no dying peer explains it: counted, the first of a kind logged
                self.unexpected(key, peer, e)
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
            self.unexpected(key, peer, e)
            return None
        if not pieces or size != total:
            # the stream closed early (the peer is going away, or the link broke): never hand on a truncated piece
            logger.info("fetch %s from %s: got %d of %d bytes", key, str(peer)[-8:], size, total)
            return None
        return b"".join(pieces)

    def unexpected(self, key: str, peer: PeerID, error: Exception) -> None:
        kind = type(error).__name__
        self.unexpected_errors[kind] = self.unexpected_errors.get(kind, 0) + 1
        if self.unexpected_errors[kind] == 1:
            logger.warning("fetch %s from ...%s failed with %s (further %s errors are counted, not logged)", key,
                           str(peer)[-8:], kind, kind, exc_info=(type(error), error, error.__traceback__))

    def _log_refused(self, peer: PeerID, reason: str) -> None:
        self.refusals_received += 1
        now = time.monotonic()
        if now - self._last_refused_log >= 10.0:
            self._last_refused_log = now
            logger.warning("peer ...%s refused our request: %s", str(peer)[-8:], reason)
