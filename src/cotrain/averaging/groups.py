"""Group formation without a timer: every peer computes the same groups for a round from the progress board.

hivemind's matchmaking assembles a group by waiting ``matchmaking_time`` for followers: every round paid that
timer before a byte moved. But the progress board already says who is at which round, so each peer of the round
can compute the groups itself (:func:`plan_groups`: the round's peers in a fixed order, shuffled by a seed every
peer knows and cut into groups of ``target_group_size``) and then only check that its groupmates computed the same
one: each publishes a small :class:`Meeting` (the group's key, its weight, its state hash and its credential) and
fetches its groupmates' (:func:`meeting_outcome`). When they all agree the all-reduce starts at once, a round trip
after the last groupmate got there; when they do not (a peer that joined between two board reads, one that left)
the caller falls back to hivemind's matchmaking, which forms a group out of whoever is there.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

#: a meeting message is a few hundred bytes; anything larger is not one
MAX_MEETING_BYTES = 4096


def plan_groups(round_number: int, peers: Sequence[str], target_group_size: int, seed: str) -> list[list[str]]:
    """The groups of a round: ``peers`` (ids, the planner included) in sorted order, shuffled by a generator seeded
    with (``seed``, round) and cut into ``ceil(n / target_group_size)`` groups of near-equal size (0: one group).
    Every peer with the same view of the round computes the same groups; the shuffle changes groupmates from round
    to round, so that updates spread through the whole swarm."""
    members = sorted(set(peers))
    if not members:
        return []
    size = target_group_size if target_group_size > 0 else len(members)
    count = -(-len(members) // size)
    if count == 1:
        return [members]
    random.Random(f"{seed}/{round_number}").shuffle(members)
    return [sorted(members[i::count]) for i in range(count)]


def group_of(me: str, groups: Sequence[Sequence[str]]) -> list[str]:
    return next((list(g) for g in groups if me in g), [me])


def group_key(round_number: int, members: Sequence[str]) -> str:
    """Names a round's group: two peers agree on their group exactly when their keys are equal."""
    return hashlib.sha1(f"{round_number}|{'|'.join(sorted(members))}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Meeting:
    """What a peer tells its planned groupmates before the all-reduce (what matchmaking's gather carried)."""

    round: int
    group: str  # group_key of the group it planned
    samples: int  # its weight: the samples of its round
    hash: str  # its shared state's hash (a peer whose state differs resyncs after the round)
    reducer: bool  # False: nobody can dial it (behind NAT), it reduces no part
    cred: bytes  # its data-plane credential

    def encode(self) -> bytes:
        return json.dumps({"round": self.round, "group": self.group, "samples": self.samples, "hash": self.hash,
                           "reducer": self.reducer, "cred": self.cred.hex()}).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Meeting":
        """Raises ValueError naming the field for bytes that are not a meeting (they come from a peer)."""
        if len(data) > MAX_MEETING_BYTES:
            raise ValueError(f"meeting: {len(data)} bytes, more than {MAX_MEETING_BYTES}")
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"meeting: not JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ValueError("meeting: not an object")
        kinds = {"round": int, "group": str, "samples": int, "hash": str, "reducer": bool, "cred": str}
        for field, kind in kinds.items():
            value = raw.get(field)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"meeting: {field} must be {kind.__name__}, got {type(value).__name__}")
        if raw["round"] < 0 or raw["samples"] < 0:
            raise ValueError("meeting: round and samples must be >= 0")
        try:
            cred = bytes.fromhex(raw["cred"])
        except ValueError:
            raise ValueError("meeting: cred must be hex") from None
        return cls(raw["round"], raw["group"][:64], raw["samples"], raw["hash"][:64], raw["reducer"], cred)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str
    meetings: Mapping[str, Meeting]  # groupmate -> its meeting (the planner's own included), when ok


def meeting_outcome(me: str, mine: Meeting, members: Sequence[str], received: Mapping[str, Optional[bytes]],
                    admitted) -> Outcome:
    """Whether a planned group met: every groupmate's meeting arrived, is one, names this round and the same group,
    and carries a credential ``admitted(peer, cred)`` accepts. -> the outcome, with the reason in words."""
    meetings = {me: mine}
    for peer in members:
        if peer == me:
            continue
        data = received.get(peer)
        if data is None:
            return Outcome(False, f"peer {peer[-8:]} did not come to the round's meeting", {})
        try:
            meeting = Meeting.decode(data)
        except ValueError as e:
            return Outcome(False, f"peer {peer[-8:]} sent no meeting ({e})", {})
        if meeting.round != mine.round or meeting.group != mine.group:
            return Outcome(False, f"peer {peer[-8:]} planned another group (round {meeting.round})", {})
        if not admitted(peer, meeting.cred):
            return Outcome(False, f"peer {peer[-8:]} has no valid credential", {})
        meetings[peer] = meeting
    return Outcome(True, f"all {len(members)} planned peers met", meetings)
