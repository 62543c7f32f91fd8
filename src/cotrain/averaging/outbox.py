"""What an exchange holds for its peers, without the network: the pieces it serves, who asked for them, and the pieces
peers left with their requests (:class:`~cotrain.averaging.exchange.Exchange` serves and fetches them over libp2p).

Each table is bounded and thread-safe: the node's threads publish and read them while the exchange's event loop
serves requests.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

#: pieces peers leave with this one while their requests wait (``FetchRequest.deposit``, see ``Exchange.join``): at
#: most this many at once, of at most this many bytes in all (each at most ``DepositBox.max_bytes``). A round's host
#: holds one a groupmate, and one peer at most a few; more are refused (the request is answered "not found", and the
#: peer's meeting fails like one that did not come)
MAX_DEPOSITS = 512
MAX_DEPOSITS_PER_PEER = 8
MAX_DEPOSIT_TOTAL_BYTES = 64 << 20
#: who asked for a piece: the newest keys, askers a key, and how long an ask is remembered
MAX_ASKED_KEYS = 64
MAX_ASKERS_PER_KEY = 256
ASK_MEMORY_S = 60.0


class Outbox:
    """Pieces published under keys, each key belonging to a round's tag; only the newest ``keep_tags`` tags are kept.
    A key counts its versions (how many times a piece was published under it, and whether the last one is settled)
    and the reads still expected of its piece."""

    def __init__(self, keep_tags: int):
        self.keep_tags = keep_tags
        self._lock = threading.Lock()
        self._pieces: dict[str, bytes] = {}
        #: reads still expected of published pieces, by key (``publish(..., readers=n)``)
        self._awaited: dict[str, int] = {}
        #: key -> (how many times a piece was published under it, whether the last one is settled)
        self._versions: dict[str, tuple[int, bool]] = {}
        self._tags: list[str] = []

    def publish(self, tag: str, key: str, data: bytes, readers: int = 0, settled: bool = True) -> None:
        """See ``Exchange.publish``."""
        with self._lock:
            if tag not in self._tags:
                self._tags.append(tag)
                while len(self._tags) > self.keep_tags:
                    old = self._tags.pop(0)
                    # over every table's own keys: a withdrawn piece (a meeting that did not fill) keeps its version
                    for table in (self._pieces, self._awaited, self._versions):
                        for k in [k for k in table if k.startswith(old + "/")]:
                            del table[k]
            self._pieces[key] = data
            self._versions[key] = (self._versions.get(key, (0, True))[0] + 1, settled)
            if readers > 0:
                self._awaited[key] = readers
            else:
                self._awaited.pop(key, None)

    def withdraw(self, key: str) -> None:
        """Stop serving ``key``; its version stays, so requests wait for its next piece."""
        with self._lock:
            self._pieces.pop(key, None)
            self._awaited.pop(key, None)

    def version(self, key: str) -> int:
        """How many pieces were published under ``key`` so far."""
        with self._lock:
            return self._versions.get(key, (0, True))[0]

    def piece(self, key: str, after: Optional[int] = None) -> Optional[bytes]:
        """The piece under ``key``, or None. ``after``: only a piece published after the ``after``-th under the key,
        or a settled one (None: any)."""
        with self._lock:
            data = self._pieces.get(key)
            if data is None:
                return None
            version, settled = self._versions.get(key, (0, True))
            return data if after is None or settled or version > after else None

    def was_read(self, key: str) -> None:
        """A groupmate got the whole piece under ``key``."""
        with self._lock:
            left = self._awaited.get(key)
            if left is not None:
                if left <= 1:
                    del self._awaited[key]
                else:
                    self._awaited[key] = left - 1

    @property
    def reads_awaited(self) -> int:
        with self._lock:
            return sum(self._awaited.values())

    def keys(self) -> set[str]:
        """Every key any table still holds (published, awaited or versioned)."""
        with self._lock:
            return set(self._pieces) | set(self._awaited) | set(self._versions)


class Askers:
    """Who asked for which key, and when: bounded to the newest ``MAX_ASKED_KEYS`` keys, ``MAX_ASKERS_PER_KEY``
    askers a key, each forgotten after ``ASK_MEMORY_S``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._asked: dict[str, dict[str, float]] = {}

    def note(self, key: str, peer: str) -> None:
        now = self._clock()
        with self._lock:
            asked = self._asked.pop(key, {})
            asked = {p: at for p, at in asked.items() if now - at < ASK_MEMORY_S}
            if peer in asked or len(asked) < MAX_ASKERS_PER_KEY:
                asked[peer] = now
            self._asked[key] = asked  # the newest key last
            while len(self._asked) > MAX_ASKED_KEYS:
                del self._asked[next(iter(self._asked))]

    def within(self, key: str, within_s: float) -> set[str]:
        """The peers that asked for ``key`` in the last ``within_s`` seconds."""
        since = self._clock() - within_s
        with self._lock:
            return {peer for peer, at in self._asked.get(key, {}).items() if at >= since}


class DepositBox:
    """Pieces peers left with their requests, by key and then by peer, while the request waits; bounded in size and
    number. ``max_bytes``: the largest piece taken (0: none); its owner sets it to the largest it reads."""

    def __init__(self):
        self.max_bytes = 0
        #: pieces peers tried to leave that were not kept (too large, or too many at once)
        self.refused = 0
        self._deposits: dict[str, dict[str, bytes]] = {}
        self._bytes = 0
        #: counts every deposit filed or dropped: what :meth:`wait` waits to see change
        self._events = 0
        self._changed = threading.Condition()

    def get(self, key: str) -> dict[str, bytes]:
        with self._changed:
            return dict(self._deposits.get(key, {}))

    def wait(self, seen: int, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for a deposit to be filed or dropped after the ``seen``-th (any key; -1: the
        count now, at once); -> how many there have been."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._changed:
            while self._events <= seen and time.monotonic() < deadline:
                self._changed.wait(deadline - time.monotonic())
            return self._events

    def file(self, key: str, peer: str, data: bytes) -> bool:
        """Keep ``data`` as what ``peer`` left under ``key`` (its newest replaces an older one); False: not kept."""
        with self._changed:
            box = self._deposits.get(key, {})
            old = box.get(peer, b"")
            count = sum(len(b) for b in self._deposits.values())
            theirs = sum(peer in b for b in self._deposits.values())
            if (len(data) > self.max_bytes
                    or (peer not in box and (count >= MAX_DEPOSITS or theirs >= MAX_DEPOSITS_PER_PEER))
                    or self._bytes - len(old) + len(data) > MAX_DEPOSIT_TOTAL_BYTES):
                self.refused += 1
                return False
            self._deposits.setdefault(key, {})[peer] = data
            self._bytes += len(data) - len(old)
            self._events += 1
            self._changed.notify_all()
            return True

    def drop(self, key: str, peer: str, data: bytes) -> None:
        """The request that left ``data`` ended: forget it (unless a newer request of the peer replaced it)."""
        with self._changed:
            box = self._deposits.get(key)
            if box is not None and box.get(peer) is data:
                del box[peer]
                self._bytes -= len(data)
                if not box:
                    del self._deposits[key]
                self._events += 1
                self._changed.notify_all()
