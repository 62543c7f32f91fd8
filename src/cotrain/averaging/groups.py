"""Group formation without a timer: every peer computes the same groups for a round from the progress board.

hivemind's matchmaking assembles a group by waiting ``matchmaking_time`` for followers: every round paid that
timer before a byte moved. But the progress board already says who is at which round, so each peer of the round
can compute the groups itself (:func:`plan_groups`: the round's peers in a fixed order, shuffled by a seed every
peer knows and cut into groups of ``target_group_size``) and then only check that its groupmates computed the same
one: each publishes a small :class:`Meeting` (the group's key, its weight, its state hash and its credential) and
fetches its groupmates' (:func:`meeting_outcome`). When they all agree the all-reduce starts at once, a round trip
after the last groupmate got there; when they do not (a peer that joined between two board reads, one that left)
the caller falls back to hivemind's matchmaking, which forms a group out of whoever is there. A meeting held once
the round's wait is over (``subset``) goes with the planned peers that came and agree, when they are two or more.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

#: a meeting message is a few hundred bytes; anything larger is not one
MAX_MEETING_BYTES = 4096


def plan_groups(round_number: int, peers: Sequence[str], target_group_size: int, seed: str) -> list[list[str]]:
    """The groups of a round: ``peers`` (ids, the planner included) in sorted order, shuffled by a generator seeded
    with (``seed``, round) and cut into ``ceil(n / target_group_size)`` groups of near-equal size (0: one group;
    never a group of one: target 2 with an odd count of peers makes one group of three).
    Every peer with the same view of the round computes the same groups; the shuffle changes groupmates from round
    to round, so that updates spread through the whole swarm."""
    members = sorted(set(peers))
    if not members:
        return []
    size = target_group_size if target_group_size > 0 else len(members)
    # ceil(n / size) groups, but none of one peer (it could not average): with target 2 and an odd count of peers,
    # one group of three
    count = min(-(-len(members) // size), max(1, len(members) // 2))
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
    #: its how-many-th meeting of the round (from 0): a peer that meets again in a round (its earlier meeting did
    #: not fill) answers every meeting apart, so a groupmate that read an earlier one never reads a later answer
    attempt: int = 0

    def encode(self) -> bytes:
        return json.dumps({"round": self.round, "group": self.group, "samples": self.samples, "hash": self.hash,
                           "reducer": self.reducer, "cred": self.cred.hex(), "attempt": self.attempt}).encode()

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
        kinds = {"round": int, "group": str, "samples": int, "hash": str, "reducer": bool, "cred": str, "attempt": int}
        for field, kind in kinds.items():
            value = raw.get(field)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"meeting: {field} must be {kind.__name__}, got {type(value).__name__}")
        if raw["round"] < 0 or raw["samples"] < 0 or raw["attempt"] < 0:
            raise ValueError("meeting: round, samples and attempt must be >= 0")
        try:
            cred = bytes.fromhex(raw["cred"])
        except ValueError:
            raise ValueError("meeting: cred must be hex") from None
        return cls(raw["round"], raw["group"][:64], raw["samples"], raw["hash"][:64], raw["reducer"], cred,
                   min(raw["attempt"], 1 << 31))


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str
    meetings: Mapping[str, Meeting]  # groupmate -> its meeting (the planner's own included), when ok
    #: a groupmate planned another group for the round: its view of the board differed from ours (a peer that
    #: joined or left between two reads). Matchmaking cannot help when it already went on with its own group
    disagreed: bool = False


def meeting_outcome(me: str, mine: Meeting, members: Sequence[str], received: Mapping[str, Optional[bytes]],
                    admitted, subset: bool = False) -> Outcome:
    """Whether a planned group met: every groupmate's meeting arrived, is one, names this round and the same group,
    and carries a credential ``admitted(peer, cred)`` accepts. -> the outcome, with the reason in words.

    ``subset``: the planned peers that did so meet without the others, when they are two at least (this one
    included). Every peer that planned the same group planned the same members (the group's key names them), so
    they all fetch the same meetings; whether they all got the same ones is :func:`hold_meeting`'s answers' to
    check. For a meeting held when peers had every chance to come (the round's wait is over, or a groupmate already
    averages): at 32 nodes on a sharded board, read every 4 s, views of who is at a round differed so often that
    618 all-or-nothing meetings failed against 39 rounds applied."""
    meetings = {me: mine}
    failures: list[Outcome] = []
    for peer in members:
        if peer == me:
            continue
        data = received.get(peer)
        if not data:  # nothing yet, or its meeting withdrawn (it did not fill; it will meet again)
            failures.append(Outcome(False, f"peer {peer[-8:]} did not come to the round's meeting", {}))
            continue
        try:
            meeting = Meeting.decode(data)
        except ValueError as e:
            failures.append(Outcome(False, f"peer {peer[-8:]} sent no meeting ({e})", {}))
            continue
        if meeting.round != mine.round or meeting.group != mine.group:
            failures.append(Outcome(False, f"peer {peer[-8:]} planned another group (round {meeting.round})", {},
                                    disagreed=True))
            continue
        if not admitted(peer, meeting.cred):
            failures.append(Outcome(False, f"peer {peer[-8:]} has no valid credential", {}))
            continue
        meetings[peer] = meeting
    if not failures:
        return Outcome(True, f"all {len(members)} planned peers met", meetings)
    if subset and len(meetings) >= 2:
        return Outcome(True, f"{len(meetings)} of the {len(members)} planned peers met ({failures[0].reason})",
                       meetings)
    return failures[0]


class Transport(Protocol):
    """What a meeting needs of the network (:class:`cotrain.averaging.exchange.Exchange` in a node; an in-memory fake
    in unit tests): publish a piece under a key, fetch pieces from peers."""

    def publish(self, tag: str, key: str, data: bytes) -> None: ...

    def fetch_many(self, requests: Sequence[tuple[Any, str]], wait_s: float) -> list[Optional[bytes]]: ...


def fetch_until(transport: Transport, peers: Mapping[str, Any], key: str, wait_s: float,
                stop: Optional[threading.Event] = None, retry_s: float = 0.1,
                gone: Callable[[str], bool] = lambda peer: False) -> dict[str, Optional[bytes]]:
    """``key`` from every peer (id -> transport address), trying again whoever did not answer until ``wait_s`` has
    passed: a peer reachable only over a connection it opens (behind NAT) answers once it has come to the round.
    ``gone(peer)``: the peer left the swarm (its record on the board says so): nobody asks it again."""
    stop = stop or threading.Event()
    deadline = time.monotonic() + wait_s
    received: dict[str, Optional[bytes]] = {}
    while True:
        # nothing yet, or withdrawn (WITHDRAWN), from a peer still in the swarm
        missing = [name for name in peers if not received.get(name) and not gone(name)]
        left = deadline - time.monotonic()
        if not missing or left <= 0 or stop.is_set():
            return received
        got = transport.fetch_many([(peers[name], key) for name in missing], wait_s=left)
        received.update(zip(missing, got))
        if not all(got):
            stop.wait(min(retry_s, max(0.0, deadline - time.monotonic())))


def meeting_view(meetings: Mapping[str, Meeting]) -> bytes:
    """Which meeting of each member a peer met (member and attempt), as a short digest: the members of a group go
    only when all of them met the very same meetings."""
    seen = "|".join(f"{peer}:{m.attempt}" for peer, m in sorted(meetings.items()))
    return hashlib.sha1(seen.encode()).hexdigest()[:16].encode()


#: a peer's answer after a meeting that did not fill (a view digest is 16 hex characters, never this)
NO_GO = b"-"
#: what stands under a peer's meeting key once its meeting did not fill: a groupmate meeting it again waits for
#: its next meeting, instead of meeting the old one (and then failing on its answer, over and over)
WITHDRAWN = b""


def hold_meeting(transport: Transport, me: str, mine: Meeting, peers: Mapping[str, Any], wait_s: float,
                 go_wait_s: float, admitted: Callable[[str, bytes], bool],
                 stop: Optional[threading.Event] = None, subset: bool = False,
                 gone: Callable[[str], bool] = lambda peer: False) -> Outcome:
    """This peer's side of a board group's meeting: publish ``mine``, fetch every planned groupmate's (``peers``: id
    -> transport address, ``me`` excluded) for up to ``wait_s``, decide (:func:`meeting_outcome`), then answer
    which meetings it met and hear the others' answers (up to ``go_wait_s``). The group goes only when every member
    met the same meetings (:func:`meeting_view`), so that a peer whose fetch failed (a groupmate it could not reach
    yet) does not fall back while the others start without it, and a peer that read a groupmate's earlier meeting
    of the round (``Meeting.attempt``) does not go with one that met its later one. A meeting is published under
    the round's tag and each answer under its attempt: answers never change once given. ``subset``: the planned
    peers that came and agree go without the others (:func:`meeting_outcome`); the answers asked for are theirs.
    ``gone(peer)``: a planned groupmate left the swarm since the plan (the board says so): not waited for."""
    tag = f"meet-r{mine.round}"
    transport.publish(tag, f"{tag}/meeting", mine.encode())
    received = fetch_until(transport, peers, f"{tag}/meeting", wait_s, stop, gone=gone)
    outcome = meeting_outcome(me, mine, [me, *peers], received, admitted, subset=subset)
    view = meeting_view(outcome.meetings) if outcome.ok else NO_GO
    transport.publish(tag, f"{tag}/go/{mine.attempt}", view)
    if outcome.ok:
        met = [p for p in peers if p in outcome.meetings]
        answers = transport.fetch_many([(peers[p], f"{tag}/go/{outcome.meetings[p].attempt}") for p in met],
                                       wait_s=go_wait_s)
        for peer, answer in zip(met, answers):
            if answer != view:
                why = ("no answer" if answer is None else "its meeting failed" if answer == NO_GO else
                       "it met other meetings of the round than we did")
                outcome = Outcome(False, f"peer {peer[-8:]} did not meet the others ({why})", {})
                break
    if not outcome.ok:  # after its answer: a groupmate that read this meeting reads that it failed
        transport.publish(tag, f"{tag}/meeting", WITHDRAWN)
    return outcome
