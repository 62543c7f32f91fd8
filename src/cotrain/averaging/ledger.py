"""The swarm's samples, counted over every group: a grow-only counter of each peer's samples in applied rounds.

A group smaller than the swarm (``target_group_size``, ``board_shards``) sees its own members' samples at its rounds;
the others' reach it through the progress board, where every peer publishes ``contributed``, the samples of the
rounds it applied so far. Each peer keeps the highest count it saw of every peer (:class:`Ledger`), so the sum
counts every peer once, however many times its record is read, and never goes back: the swarm's count as far as
this peer knows (its *view*). A group agrees on one figure at its meeting: the lower median of its members' views
(:func:`agreed_count`), which a member that lies about its view cannot raise. The round's samples are added to it.

A count is a peer's claim, so it is bounded by what the peer could have done: at most ``round_cap`` samples for
every round it went through (:func:`checked_count`). A claim beyond it is cut to the bound and reported once.
Entries of peers that left stay (their samples are in the model); the ledger travels with the shared state, so a
peer that joins takes them over, and keeps at most :data:`MAX_ENTRIES`, the largest.
"""

from __future__ import annotations

import threading
from typing import Mapping, Optional

#: peers kept in a ledger (and in the shared state's metadata, about 60 bytes each); beyond it the smallest counts
#: are dropped, so the count can only fall short
MAX_ENTRIES = 1024
#: how many times the run's pace (inner_steps x batch a round) a peer may contribute in one round: a GPU volunteer
#: next to CPUs takes tens of times their steps while it waits for them; more than this is a lie about its work
SPEEDUP_BOUND = 64
#: no count may exceed this (a float64 holds every integer up to 2**53: JSON and the lr's arithmetic stay exact)
MAX_COUNT = 1 << 53


def checked_count(previous: Optional[tuple[int, int]], round_number: int, claimed: int,
                  round_cap: int) -> tuple[int, str]:
    """A peer's claimed count at ``round_number``, bounded: at most ``round_cap`` a round more than what it had at
    the round of ``previous`` ((round, count) as last accepted; None: its first claim, bounded from round 0).
    -> (the count to keep, "" or the reason it was cut, in words)."""
    since_round, since_count = previous if previous is not None else (0, 0)
    rounds = max(0, round_number - since_round) + 1  # the round under way may be counted too
    bound = min(MAX_COUNT, since_count + rounds * round_cap)
    claimed = max(0, int(claimed))
    if claimed > bound:
        return bound, (f"claims {claimed} samples at round {round_number}, more than {bound} "
                       f"({round_cap} a round for {rounds} round(s))")
    return claimed, ""


def agreed_count(views: Mapping[str, int]) -> int:
    """The swarm's count a group's members agree on: the lower median of their views (``member -> view``, every
    member's, as said at the meeting), the same on every member. A member that claims more than the others cannot
    raise it; one that claims less lowers it for this round only (its groupmates' views stay theirs)."""
    values = sorted(max(0, min(MAX_COUNT, int(v))) for v in views.values())
    return values[(len(values) - 1) // 2] if values else 0


def _count(value: object) -> int:
    """A count a peer said (hostile): an integer in 0..MAX_COUNT, else 0."""
    if not isinstance(value, int) or isinstance(value, bool):
        return 0
    return max(0, min(MAX_COUNT, value))


def said_counts(info: Mapping[str, Mapping], samples: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """What a group's members said at the meeting (``info``: member -> its meeting's fields), as counts: (their
    views of the swarm's count, their contributed counts after this round: before it plus the round's ``samples``
    as the group credited them, :func:`cotrain.averaging.outcome.credited_samples`). Anything that is no count is
    taken as 0."""
    views, after = {}, {}
    for peer, said in info.items():
        views[peer] = _count(said.get("swarm", 0))
        after[peer] = min(MAX_COUNT, _count(said.get("contributed", 0)) + _count(samples.get(peer, 0)))
    return views, after


class Ledger:
    """The highest count seen of every peer (thread-safe: the board's thread observes, the round reads)."""

    def __init__(self, round_cap: int):
        self.round_cap = max(1, round_cap)
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[int, int]] = {}  # peer -> (round of the claim, count)

    def observe(self, peer: str, round_number: int, claimed: int) -> str:
        """Take a peer's claim; -> "" or why it was cut (the caller logs it once per peer)."""
        with self._lock:
            previous = self._entries.get(peer)
            count, cut = checked_count(previous, round_number, claimed, self.round_cap)
            if previous is None or count > previous[1]:
                self._entries[peer] = (max(round_number, previous[0] if previous else 0), count)
                if len(self._entries) > MAX_ENTRIES:
                    smallest = min(self._entries, key=lambda p: self._entries[p][1])
                    del self._entries[smallest]
            return cut

    def own(self, peer: str, round_number: int, count: int) -> None:
        """This peer's own count: known, not claimed (a node that trained many steps alone while its groupmates
        were gone is not cut)."""
        with self._lock:
            self._entries[peer] = (round_number, max(0, min(MAX_COUNT, count)))

    def count_of(self, peer: str) -> int:
        with self._lock:
            entry = self._entries.get(peer)
            return entry[1] if entry else 0

    def total(self) -> int:
        with self._lock:
            return sum(count for _, count in self._entries.values())

    def to_metadata(self) -> dict[str, list[int]]:
        with self._lock:
            return {peer: [r, c] for peer, (r, c) in self._entries.items()}

    def take(self, metadata: object) -> None:
        """Merge a ledger from a downloaded state's metadata (a peer's: malformed entries are skipped)."""
        if not isinstance(metadata, dict):
            return
        for peer, entry in list(metadata.items())[:MAX_ENTRIES]:
            if (isinstance(peer, str) and len(peer) <= 128 and isinstance(entry, (list, tuple)) and len(entry) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in entry)):
                self.observe(peer, entry[0], entry[1])
