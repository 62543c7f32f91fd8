"""A swarm in one process's memory: the ports of :mod:`cotrain.averaging.ports` without a DHT or a libp2p daemon.

Every peer of a :class:`MemorySwarm` gets a :class:`MemoryBoard` (one progress board that all of them share, its
records expiring as the DHT's do) and a :class:`MemoryExchange` (the exchange's own tables, :mod:`cotrain.averaging.
outbox`, with requests answered by the peer they go to, in the caller's thread). The real strategies run over them
(``build_strategy(..., ports=swarm.ports(peer_id))``): meetings, all-reduces, state downloads and the board's decisions go
as they do between nodes, minus the network, so a test of three peers' rounds takes seconds. A peer that
:meth:`MemorySwarm.freeze` froze neither answers nor is answered, as a peer stopped mid-round. The swarm's clock
(:mod:`cotrain.averaging.clock`) is DHT time, or a :class:`ManualClock` that only the test moves: the board's records
then age, and go stale, when the test says.
"""

from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional, Sequence

from hivemind.p2p import PeerID

from cotrain.averaging.admission import Admission
from cotrain.averaging.clock import Clock, DhtClock
from cotrain.averaging.exchange import MAX_DEPOSIT_BYTES
from cotrain.averaging.outbox import Askers, DepositBox, Outbox
from cotrain.averaging.ports import Ports
from cotrain.averaging.progress import PeerProgress, shard_of


def memory_peer_id(name: str) -> str:
    """A peer id (base58, as libp2p's) for the peer called ``name``: the same name, the same id."""
    return PeerID(b"\x12\x20" + hashlib.sha256(name.encode()).digest()).to_base58()


class ManualClock:
    """The swarm's clock as a test moves it: it stands at ``start`` until :meth:`advance`."""

    def __init__(self, start: float = 1_000_000.0):
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class MemorySwarm:
    """The peers of one run in this process: their board, their exchanges by peer id, and their clock (``clock``:
    DHT time when None)."""

    def __init__(self, run_id: str = "memory", ttl: float = 4.0, shards: int = 1, shard_rounds: int = 1,
                 clock: Optional[Clock] = None):
        self.run_id, self.ttl, self.shards, self.shard_rounds = run_id, ttl, shards, shard_rounds
        self.clock = clock or DhtClock()
        self.changed = threading.Condition()  # a piece published or withdrawn, anywhere
        self.exchanges: dict[str, MemoryExchange] = {}
        self.frozen: set[str] = set()
        self.records: dict[str, tuple[int, dict]] = {}  # peer -> (shard, its record as the DHT keeps it)

    def ports(self, peer_id: str, admission: Optional[Admission] = None) -> Ports:
        admission = admission or Admission(self.run_id, None, enabled=False)
        exchange = MemoryExchange(self, peer_id, admission)
        self.exchanges[peer_id] = exchange
        return Ports(MemoryBoard(self, admission), exchange, clock=self.clock)

    def freeze(self, peer_id: str) -> None:
        """The peer stops answering and its requests go unanswered (a process stopped, a link cut)."""
        with self.changed:
            self.frozen.add(peer_id)
            self.changed.notify_all()

    def thaw(self, peer_id: str) -> None:
        with self.changed:
            self.frozen.discard(peer_id)
            self.changed.notify_all()


class MemoryBoard:
    """The progress board's side of :class:`~cotrain.averaging.progress.ProgressBoard`, on a swarm's shared dict."""

    def __init__(self, swarm: MemorySwarm, admission: Admission):
        self.swarm, self.admission, self.shards = swarm, admission, swarm.shards

    def shard(self, round_number: int, peer_id: str) -> int:
        return shard_of(self.swarm.run_id, round_number, peer_id, self.shards, self.swarm.shard_rounds)

    def publish(self, progress: PeerProgress, shard: Optional[int] = None) -> Future:
        record = dict(progress.to_record(), time=self.swarm.clock.now())
        stored: Future = Future()
        with self.swarm.changed:
            if progress.peer_id not in self.swarm.frozen:
                self.swarm.records[progress.peer_id] = (
                    self.shard(progress.round, progress.peer_id) if shard is None else shard, record)
        stored.set_result(True)
        return stored

    def read(self, timeout: float = 5.0, shard: int = 0) -> Optional[list[PeerProgress]]:
        return [p for s, p in self._live() if s == shard]

    def read_all(self, timeout: float = 5.0) -> Optional[list[PeerProgress]]:
        return [p for _, p in self._live()]

    def read_revocations(self, timeout: float = 5.0) -> bool:
        return False

    def _live(self) -> list[tuple[int, PeerProgress]]:
        now = self.swarm.clock.now()
        with self.swarm.changed:
            records = list(self.swarm.records.items())
        out = []
        for peer, (shard, record) in records:
            if now - record["time"] <= self.swarm.ttl:
                parsed = PeerProgress.from_record(peer, record)
                if parsed is not None:
                    out.append((shard, parsed))
        return out


class MemoryExchange:
    """:class:`~cotrain.averaging.exchange.Exchange`'s interface over a :class:`MemorySwarm`: a request is answered
    by the peer it goes to, from its outbox, in the caller's thread (waiting on the swarm's condition)."""

    def __init__(self, swarm: MemorySwarm, peer_id: str, admission: Admission, keep_tags: int = 8):
        self.swarm, self.peer_id, self.admission = swarm, peer_id, admission
        self.outbox = Outbox(keep_tags)
        self.asked = Askers()
        self.deposit_box = DepositBox()
        self.bytes_sent = self.bytes_received = self.state_bytes_sent = self.state_bytes_received = 0
        self._providers: dict[str, Callable[[], Optional[bytes]]] = {}
        self._pool = ThreadPoolExecutor(8, thread_name_prefix=f"memory-{peer_id[-6:]}")

    # ---- serving ---------------------------------------------------------------------------------------------
    def publish(self, tag: str, key: str, data: bytes, readers: int = 0, settled: bool = True) -> None:
        with self.swarm.changed:
            self.outbox.publish(tag, key, data, readers, settled)
            self.swarm.changed.notify_all()

    def withdraw(self, key: str) -> None:
        with self.swarm.changed:
            self.outbox.withdraw(key)
            self.swarm.changed.notify_all()

    @property
    def reads_awaited(self) -> int:
        return self.outbox.reads_awaited

    def askers(self, key: str, within_s: float) -> set[str]:
        return self.asked.within(key, within_s)

    def deposits(self, key: str) -> dict[str, bytes]:
        return self.deposit_box.get(key)

    def wait_deposits(self, seen: int, timeout: float) -> int:
        return self.deposit_box.wait(seen, timeout)

    @property
    def max_deposit_bytes(self) -> int:
        return self.deposit_box.max_bytes

    @max_deposit_bytes.setter
    def max_deposit_bytes(self, value: int) -> None:
        self.deposit_box.max_bytes = value

    def provide(self, key: str, make: Callable[[], Optional[bytes]]) -> None:
        self._providers[key] = make

    def _answer(self, asker: str, key: str, wait_s: float, deposit: bytes = b"") -> Optional[bytes]:
        """What this peer answers ``asker``'s request for ``key`` (as Exchange._serve_unary and _serve_chunks)."""
        if not self.admission.check(self.swarm.exchanges[asker].admission.credential(), asker, "a request").ok:
            return None
        if key in self._providers:
            return self._providers[key]()
        self.asked.note(key, asker)
        after, filed = None, None
        if deposit:
            after = self.outbox.version(key)
            if not self.deposit_box.file(key, asker, deposit):
                return None
            filed = deposit
        deadline = time.monotonic() + max(0.0, wait_s)
        try:
            with self.swarm.changed:
                while True:
                    blocked = {asker, self.peer_id} & self.swarm.frozen
                    data = None if blocked else self.outbox.piece(key, after)
                    left = deadline - time.monotonic()
                    if data is not None or left <= 0:
                        break
                    self.swarm.changed.wait(left)
            if data is not None:
                self.outbox.was_read(key)
            return data
        finally:
            if filed is not None:
                self.deposit_box.drop(key, asker, filed)

    # ---- asking ----------------------------------------------------------------------------------------------
    def _ask(self, peer, key: str, wait_s: float, deposit: bytes = b"",
             max_bytes: Optional[int] = None) -> Optional[bytes]:
        target = self.swarm.exchanges.get(str(peer))
        if target is None:
            time.sleep(min(wait_s, 0.05))  # nobody there: the request fails as a dial would
            return None
        data = target._answer(self.peer_id, key, wait_s, deposit)
        if data is None or (max_bytes is not None and len(data) > max_bytes):
            return None
        self.bytes_received += len(data)
        target.bytes_sent += len(data)
        return data

    def fetch_many(self, requests: Sequence[tuple[object, str]], wait_s: float, large: bool = False,
                   max_bytes: Optional[int] = None) -> list[Optional[bytes]]:
        futures = [self._pool.submit(self._ask, peer, key, wait_s, b"", max_bytes) for peer, key in requests]
        return [f.result() for f in futures]

    def join(self, peer, key: str, deposit: bytes, wait_s: float,
             max_bytes: Optional[int] = None) -> Optional[bytes]:
        if not deposit or len(deposit) > MAX_DEPOSIT_BYTES:
            return None
        return self._ask(peer, key, wait_s, deposit, max_bytes)

    def fetch(self, peer, key: str, wait_s: float, timeout: float,
              on_progress: Optional[Callable[[int, int], None]] = None, state: bool = False) -> Optional[bytes]:
        data = self._ask(peer, key, min(wait_s, timeout))
        if data is not None and on_progress is not None:
            on_progress(len(data), len(data))
        return data

    def shutdown(self, linger_s: float = 2.0) -> None:
        """Leave the swarm once the pieces groupmates are to read were read (up to ``linger_s``)."""
        deadline = time.monotonic() + linger_s
        while self.reads_awaited > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.swarm.exchanges.pop(self.peer_id, None)
        self._pool.shutdown(wait=False, cancel_futures=True)
