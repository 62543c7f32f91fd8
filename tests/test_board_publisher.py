"""The progress board's thread (cotrain.averaging.board_publisher) against a board kept in memory: what it publishes
and reads, what it hands back, and that a failed read leaves the view as it was."""

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest

from cotrain.averaging.board_publisher import BoardPublisher
from cotrain.averaging.board_view import BoardView
from cotrain.averaging.progress import PeerProgress

PASS_S = 10.0  # the longest a test waits for one pass of the thread (it runs at once when woken)


@dataclass
class Counts:
    board_reads: int = 0
    board_reads_skipped: int = 0


@dataclass
class Admission:
    enabled: bool = False


@dataclass
class MemoryBoard:
    """What the publisher uses of a ProgressBoard: the shard of a round is the round modulo 3."""

    records: list = field(default_factory=list)
    answers: bool = True  # False: a read that the DHT did not answer in time
    admission: Admission = field(default_factory=Admission)
    published: list = field(default_factory=list)
    shards_read: list = field(default_factory=list)
    revocation_reads: int = 0

    def shard(self, round_number: int, peer_id: str) -> int:
        return round_number % 3

    def publish(self, progress: PeerProgress) -> Future:
        self.published.append(progress)
        stored = Future()
        stored.set_result(True)
        return stored

    def read(self, timeout: float = 5.0, shard: int = 0):
        self.shards_read.append(shard)
        return list(self.records) if self.answers else None

    def read_revocations(self, timeout: float = 5.0) -> bool:
        self.revocation_reads += 1
        return False


class Harness:
    """A publisher whose every pass ends by handing its view to ``passes`` (through ``steady``), with an interval
    long enough that only :meth:`BoardPublisher.wake` starts another pass."""

    def __init__(self, board: MemoryBoard):
        self.board, self.stats, self.claims = board, Counts(), []
        self.me = PeerProgress("me", 4, 2, 16, "train")
        self.paused = False
        self.passes: queue.Queue = queue.Queue()
        self.publisher = BoardPublisher(board, 3600.0, progress=lambda: self.me, paused=lambda: self.paused,
                                        steady=self._steady, stats=self.stats, on_counts=self.claims.extend)

    def _steady(self, view: BoardView) -> bool:
        self.passes.put(view)
        return False

    def next_pass(self, wake: bool = True) -> BoardView:
        if wake:
            self.publisher.wake()
        return self.passes.get(timeout=PASS_S)


@pytest.fixture
def harness():
    made = []

    def make(board: MemoryBoard) -> Harness:
        h = Harness(board)
        before = set(threading.enumerate())
        h.publisher.start()
        h.thread = next(t for t in set(threading.enumerate()) - before if t.name == "progress")
        made.append(h)
        return h

    yield make
    for h in made:
        h.publisher.stop()
        assert not h.thread.is_alive()


def test_a_pass_publishes_this_peers_record_and_hands_back_the_read_of_its_rounds_shard(harness):
    others = [PeerProgress("a", 4, 1, 8, time=10.0, contributed=64), PeerProgress("b", 3, 9, 72, contributed=32)]
    h = harness(MemoryBoard(records=[*others, PeerProgress("me", 3, 0, 0)]))
    seen = h.next_pass(wake=False)
    assert h.board.published == [h.me] and h.board.shards_read == [4 % 3]
    assert seen is h.publisher.view and h.publisher.wait_for_read(0.0)
    assert seen.peers == (*others, PeerProgress("me", 3, 0, 0)) and seen.view_round == 4 and seen.read_at > 0
    assert h.claims == [("a", 4, 64), ("b", 3, 32)]  # every other peer's count, for the ledger
    assert (h.stats.board_reads, h.stats.board_reads_skipped) == (1, 0)
    assert h.board.revocation_reads == 0  # not a run with members' credentials
    assert h.next_pass().same_reads == 1  # the same peers again


def test_a_read_that_failed_leaves_the_view_as_it_was(harness):
    h = harness(MemoryBoard(records=[PeerProgress("a", 4, 1, 8)], answers=False))
    assert h.next_pass(wake=False) == BoardView() and not h.publisher.wait_for_read(0.0)
    h.board.answers = True
    assert [p.peer_id for p in h.next_pass().peers] == ["a"]
    h.board.answers = False
    assert [p.peer_id for p in h.next_pass().peers] == ["a"]
    assert h.stats.board_reads == 3


def test_a_paused_peer_reads_nothing_and_publishes_again_only_when_its_record_changes(harness):
    h = harness(MemoryBoard(records=[PeerProgress("a", 4, 1, 8)], admission=Admission(enabled=True)))
    h.next_pass(wake=False)
    h.paused = True
    h.next_pass()
    assert (h.stats.board_reads, h.stats.board_reads_skipped) == (1, 1)
    assert len(h.board.published) == 1  # the same round and phase, within one and a half intervals
    h.me = PeerProgress("me", 4, 3, 24, "average")
    h.next_pass()
    assert h.board.published[-1].phase == "average" and len(h.board.published) == 2
    assert h.board.shards_read == [1] and h.stats.board_reads_skipped == 2
    assert h.board.revocation_reads >= 1  # a run with members' credentials reads the revocation list too
