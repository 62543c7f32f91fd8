"""The progress board's thread: publishes this peer's record and reads its shard every ``progress_interval``.

It runs beside the training and the rounds, and talks to them only through values and callables: it asks for the
record to publish (``progress``), whether reads pause (``paused``) and whether the view is steady (``steady``); it
hands each read's records on to the ledger (``on_counts``), and the read itself as one :class:`BoardView`, replaced
whole, which the rounds take with :attr:`BoardPublisher.view`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable, Iterable, Optional, Protocol

from cotrain.averaging.board_view import BoardView, board_time, next_view
from cotrain.averaging.clock import DhtClock
from cotrain.averaging.progress import PeerProgress, ProgressBoard, RoundRules, live_peers
from cotrain.outage import Outage

logger = logging.getLogger(__name__)

#: seconds between two reads of the coordinator's revocation list on the DHT. Heartbeat answers carry it within a
#: heartbeat interval while the coordinator is up; the DHT is the way it reaches nodes whose coordinator link is
#: down, so a few seconds is plenty, and reading every progress interval cost rounds 2% on 2 cores
REVOCATIONS_READ_S = 5.0
#: a steady group's members (see board_view.view_steady) publish and read the board this many times less often:
#: still within a record's life of three intervals, and a change (a peer that comes, goes or lags) is seen at most one
#: interval later. The board's reads and stores are DHT requests that the DHT processes and libp2p daemons of every
#: replica answer: at 8 nodes on 2 cores, ten rounds a second, they were a third of the rounds' CPU, and every
#: other interval a tenth of the round's time
STEADY_STRETCH = 2


class PublishRefused(RuntimeError):
    """No DHT node stored this peer's progress record (every one it reached refused it, or none answered)."""


class ReadCounts(Protocol):
    """Where the publisher counts its reads (RoundStats)."""

    board_reads: int
    board_reads_skipped: int


class BoardPublisher:
    """Publishes ``progress()`` on ``board`` and reads the shard of its round, every ``interval`` seconds
    (STEADY_STRETCH times that while ``steady(view)``), on a thread of its own; :meth:`wake` makes it go at once.

    ``paused()``: skip the read (the record is still published, less often while its round and phase stay as they
    were); ``stats``: counts the reads made and skipped; ``on_counts``: every read's ``(peer, round, contributed)``
    of the other peers; ``now``: the swarm's clock (a read's time). Failures to store and to read are logged apart
    (cotrain.outage), and the thread goes on."""

    def __init__(self, board: ProgressBoard, interval: float, *, progress: Callable[[], PeerProgress],
                 paused: Callable[[], bool], steady: Callable[[BoardView], bool], stats: ReadCounts,
                 on_counts: Callable[[Iterable[tuple[str, int, int]]], None],
                 now: Callable[[], float] = DhtClock().now):
        self.board, self.interval = board, interval
        self._progress, self._paused, self._steady = progress, paused, steady
        self._stats, self._on_counts, self._now = stats, on_counts, now
        #: the last read, replaced whole by this thread (one reference assignment: readers never see half of one)
        self._view = BoardView()
        self._stop = threading.Event()
        #: set when the round changes on a sharded board: publish in and read the new round's shard at once
        self._wake = threading.Event()
        self._read = threading.Event()  # set by the first read that came in
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)

    @property
    def view(self) -> BoardView:
        """The board as of the last read that came in."""
        return self._view

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Publish and read now rather than at the end of the interval."""
        self._wake.set()

    def wait_for_read(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a first read of the board to come in; True once one has."""
        return self._read.wait(timeout=timeout)

    def wait_for_peers(self, count: int, timeout: float, rules: RoundRules,
                       stop: Optional[threading.Event] = None) -> int:
        """Wait until ``count`` peers (this one included) are on the board, its records judged when it was read (as
        rounds judge them, by ``rules``: on a loaded machine a read takes seconds); -> how many there are."""
        sharded = self.board.shards > 1
        me = self._progress()
        deadline = time.monotonic() + timeout
        said = time.monotonic()
        while True:
            view = self._view
            # a sharded board's view is one shard: count the swarm from every shard (O(N), once at a start)
            peers = (self.board.read_all() or []) if sharded else view.peers
            live = {p.peer_id for p in live_peers(board_time(view, self._now(), rules), self._progress(), peers,
                                                  rules)}
            live.add(me.peer_id)
            if len(live) >= count or time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                return len(live)
            if time.monotonic() - said >= 30.0:
                said = time.monotonic()
                logger.info("waiting for peers: %d of %d on the progress board (%d records read %.0fs ago)",
                            len(live), count, len(peers), self._now() - view.read_at)
            time.sleep(self.interval * (2 if sharded else 0.5))  # every shard: less often

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        revocations_read = 0.0
        reading = Outage("progress board", logger)
        storing = Outage("publishing this peer's progress", logger)
        action = f"retrying every {self.interval:g}s"
        published = None  # the last publication's future, checked one interval later (never waited on)
        last = (-1, "", -math.inf)  # the round and phase of the last record published, and when
        while not self._stop.is_set():
            paused = self._paused()
            mine = self._progress()  # one record a pass: what it publishes, and the round whose shard it reads
            # what we publish and what we read fail apart: a record no DHT node stored must not keep this peer from
            # reading the others' (nor the revocation list)
            try:
                if published is not None and published.done():
                    if published.result() is True:
                        storing.succeeded()
                    else:
                        storing.failed(PublishRefused("no DHT node stored this peer's progress record"), action=action)
                # a kept group's member (nobody plans with its record) publishes every other interval while its round
                # and phase stay as they were: still well within the record's life of three intervals
                if (not paused or last[:2] != (mine.round, mine.phase)
                        or time.monotonic() - last[2] >= 1.5 * self.interval):
                    last = (mine.round, mine.phase, time.monotonic())
                    published = self.board.publish(mine)
            except (OSError, EOFError) as e:
                if not self._stop.is_set():  # shutting down, or the DHT briefly unreachable
                    storing.failed(e, action=action)
            except Exception as e:  # noqa: BLE001 - a bug: logged with its traceback, the board keeps going
                if not self._stop.is_set():
                    storing.failed(e, expected=False, action=action)
            try:
                if paused:
                    self._stats.board_reads_skipped += 1
                else:
                    read_at = self._now()
                    self._stats.board_reads += 1
                    peers = self.board.read(shard=self.board.shard(mine.round, mine.peer_id))
                    if peers is None:  # a DHT that did not answer in time leaves what we knew (it goes stale)
                        raise TimeoutError("the DHT did not answer a read of the progress board in time")
                    self._view = next_view(self._view, peers, read_at, mine.round)
                    self._read.set()
                    self._on_counts((p.peer_id, p.round, p.contributed) for p in peers if p.peer_id != mine.peer_id)
                if self.board.admission.enabled and time.monotonic() - revocations_read >= REVOCATIONS_READ_S:
                    revocations_read = time.monotonic()
                    self.board.read_revocations()
                if not paused:
                    reading.succeeded()
            except (TimeoutError, OSError, EOFError) as e:
                if not self._stop.is_set():
                    reading.failed(e, action=action)
            except Exception as e:  # noqa: BLE001 - a bug: logged with its traceback, the board keeps going
                if not self._stop.is_set():
                    reading.failed(e, expected=False, action=action)
            self._wake.wait(self.interval * (STEADY_STRETCH if self._steady(self._view) else 1))
            self._wake.clear()
