"""The meeting at a group's host: the planned members (:mod:`cotrain.averaging.groups`) join, and it says who goes.

Each member joins the host with a small :class:`Meeting` (the host it names, its weight, its state hash and its
credential), one request that waits for the host's answer; the host reads its planned groupmates' meetings from
their requests, decides (:func:`meeting_outcome`) and publishes a :class:`Roster` of who goes, which answers them
(:func:`cotrain.averaging.meet.hold_meeting`). When they all come the all-reduce starts at once, a round trip after the last one got there.
One peer decides, so those that go agree on the group; peers whose views of the board differ (one read it before a
newcomer came) still meet: the host also takes in the peers that joined it unplanned (walk-ins), and a member whose
host meets elsewhere follows it to the host it names; and members behind NAT, who cannot be dialled, meet through
the host. When the meeting does not fill the caller trains on and meets again, or falls back to hivemind's
matchmaking. A meeting held once the round's wait is over (``subset``) goes with the planned peers that came and
agree, when they are two or more.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from cotrain.averaging.ledger import MAX_COUNT

#: a meeting message is a few hundred bytes; anything larger is not one
MAX_MEETING_BYTES = 4096


def meeting_key(round_number: int) -> str:
    """Where a round's meeting takes place on a peer's exchange (under :func:`meeting_tag`): members join their host
    there (their meetings left with the request, :meth:`Transport.join`), and the host answers with its roster; a
    peer that meets elsewhere puts its own meeting there, so a peer whose view made it host learns where it went."""
    return f"{meeting_tag(round_number)}/meeting"


def meeting_tag(round_number: int) -> str:
    """The exchange's tag of a round's meeting pieces (old rounds' tags are dropped)."""
    return f"meet-r{round_number}"


def host_key(round_number: int, host: str) -> str:
    """A meeting's ``group``: names the round and the host it goes to (members that name the same one meet)."""
    return hashlib.sha1(f"{round_number}|{host}".encode()).hexdigest()[:16]


#: a meeting's piece with something riding on it (a member's contribution to a hosted all-reduce, the host's result
#: with its roster): this byte, the head's length (4 bytes, little-endian), the head (the meeting or roster JSON),
#: then the rest. A piece without a rest is the head alone (JSON: it starts with "{")
PIECE_WITH_REST = b"\x01"


def piece_bound(max_head: int, max_rest: int) -> int:
    """The most bytes a piece of a head of up to ``max_head`` bytes and a rest of up to ``max_rest`` takes."""
    return 5 + max_head + max_rest


def meeting_piece_bound(max_rest: int = 0) -> int:
    """The most bytes a member's meeting takes with a rest of up to ``max_rest`` riding on it (a hosted all-reduce's
    contribution): what a host takes in with a join (``Exchange.max_deposit_bytes``)."""
    return piece_bound(MAX_MEETING_BYTES, max_rest)


def join_piece(head: bytes, rest: bytes = b"") -> bytes:
    """A meeting's or roster's piece: ``head``, and ``rest`` riding on it (see :data:`PIECE_WITH_REST`)."""
    return PIECE_WITH_REST + struct.pack("<I", len(head)) + head + rest if rest else head


def split_piece(data: bytes) -> tuple[bytes, bytes]:
    """A piece (from a peer) -> (its head, the rest). Raises ValueError for a framing that does not hold."""
    if not data.startswith(PIECE_WITH_REST):
        return data, b""
    if len(data) < 5:
        raise ValueError("piece: truncated head length")
    (size,) = struct.unpack_from("<I", data, 1)
    if size > len(data) - 5:
        raise ValueError(f"piece: a head of {size} bytes in {len(data)}")
    return data[5:5 + size], data[5 + size:]


def _json_object(data: bytes, what: str, max_bytes: int, kinds: Mapping[str, type]) -> dict:
    """``data`` (from a peer) as a JSON object whose fields have the ``kinds`` given (a bool is no int); raises
    ValueError naming ``what`` and the field."""
    if len(data) > max_bytes:
        raise ValueError(f"{what}: {len(data)} bytes, more than {max_bytes}")
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{what}: not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: not an object")
    for field, kind in kinds.items():
        value = raw.get(field)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{what}: {field} must be {kind.__name__}, got {type(value).__name__}")
    return raw


@dataclass(frozen=True)
class Meeting:
    """What a peer tells its planned groupmates before the all-reduce (what matchmaking's gather carried)."""

    round: int
    group: str  # host_key of the round and the host it goes to
    samples: int  # its weight: the samples of its round
    hash: str  # its shared state's hash (a peer whose state differs resyncs after the round)
    reducer: bool  # False: nobody can dial it (behind NAT), it reduces no part
    cred: bytes  # its data-plane credential
    #: its how-many-th meeting of the round (from 0): a peer that meets again in a round (its earlier meeting did
    #: not fill) answers every meeting apart, so a groupmate that read an earlier one never reads a later answer
    attempt: int = 0
    #: the swarm's samples as it knows them (its view), and its own in the rounds it applied (its contributed
    #: count): the group agrees on the swarm's count from them (cotrain.averaging.ledger)
    swarm: int = 0
    contributed: int = 0

    def encode(self) -> bytes:
        return json.dumps({"round": self.round, "group": self.group, "samples": self.samples, "hash": self.hash,
                           "reducer": self.reducer, "cred": self.cred.hex(), "attempt": self.attempt,
                           "swarm": self.swarm, "contributed": self.contributed}).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Meeting":
        """Raises ValueError naming the field for bytes that are not a meeting (they come from a peer)."""
        raw = _json_object(data, "meeting", MAX_MEETING_BYTES, {
            "round": int, "group": str, "samples": int, "hash": str, "reducer": bool, "cred": str, "attempt": int})
        if raw["round"] < 0 or raw["samples"] < 0 or raw["attempt"] < 0:
            raise ValueError("meeting: round, samples and attempt must be >= 0")
        counts = {}
        for name in ("swarm", "contributed"):
            value = raw.get(name, 0)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
                raise ValueError(f"meeting: {name} must be an integer in 0..2**53")
            counts[name] = value
        try:
            cred = bytes.fromhex(raw["cred"])
        except ValueError:
            raise ValueError("meeting: cred must be hex") from None
        return cls(raw["round"], raw["group"][:64], raw["samples"], raw["hash"][:64], raw["reducer"], cred,
                   min(raw["attempt"], 1 << 31), **counts)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str
    meetings: Mapping[str, Meeting]  # groupmate -> its meeting (the planner's own included), when ok
    #: a groupmate planned another group for the round (its meeting names another host), or the host did not plan
    #: us: its view of the board differed from ours (a peer that joined or left between two reads). Matchmaking
    #: cannot help when it already went on with its own group
    disagreed: bool = False
    #: what the host sent back with its roster (``hold_meeting(..., reduce=)``: a hosted all-reduce's result)
    result: bytes = b""


def meeting_outcome(me: str, mine: Meeting, members: Sequence[str], received: Mapping[str, Optional[bytes]],
                    admitted, subset: bool = False, walk_ins: Mapping[str, Optional[bytes]] = {},
                    target: int = 0) -> Outcome:
    """Whether a planned group met: every groupmate's meeting arrived, is one, names this round and the same group,
    and carries a credential ``admitted(peer, cred)`` accepts. -> the outcome, with the reason in words.

    ``subset``: the planned peers that did so meet without the others, when they are two at least (this one
    included): the host's decision, which its roster tells the others. For a meeting held when peers had every
    chance to come (the round's wait is over, or a groupmate already averages): at 32 nodes on a sharded board,
    read every 4 s, views of who is at a round differed so often that 618 all-or-nothing meetings failed against
    39 rounds applied.

    ``walk_ins``: meetings of peers the host did not plan that came to it (they asked for its meeting: their view of
    the board showed them in its group, or they were their plan's lone last peer). Those that name this round and
    group and are admitted go too, in id order, up to :func:`max_group_size` of ``target`` (0: no bound but the
    roster's); and once the group holds ``target`` peers it goes without the planned peers that did not come.
    Views of a round read every few seconds differ most in who came last: a host that waited only for its own plan
    sent away every member whose view had shown one more peer than its own (at 32 nodes, 149 meetings in a run
    failed on "went without us")."""
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
            meeting = Meeting.decode(split_piece(data)[0])
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
    planned = len(meetings)
    bound = max_group_size(target)
    for peer, data in sorted(walk_ins.items()):
        if len(meetings) >= bound:
            break
        if peer in meetings or peer in members or not data:
            continue
        try:
            meeting = Meeting.decode(split_piece(data)[0])
        except ValueError:
            continue  # a walk-in is nobody's plan: one that sent no meeting of ours is simply not of the group
        if meeting.round == mine.round and meeting.group == mine.group and admitted(peer, meeting.cred):
            meetings[peer] = meeting
    more = f" and {len(meetings) - planned} more" if len(meetings) > planned else ""
    if len(meetings) < 2:
        return failures[0] if failures else Outcome(False, "nobody came to the round's meeting", {})
    if not failures:
        return Outcome(True, f"all {len(members)} planned peers met{more}", meetings)
    if subset or (target > 0 and len(meetings) >= target):
        return Outcome(True, f"{planned} of the {len(members)} planned peers met{more} ({failures[0].reason})",
                       meetings)
    return failures[0]


def max_group_size(target: int) -> int:
    """The most peers a host takes into its group: ``2 target - 1`` (a group too small to be two of ``target``; a
    plan's lone last peer walks into the group before it), or the roster's bound when groups are not bounded."""
    return 2 * target - 1 if target > 0 else MAX_ROSTER_MEMBERS


class Transport(Protocol):
    """What a meeting needs of the network (:class:`cotrain.averaging.exchange.Exchange` in a node; an in-memory fake
    in unit tests)."""

    def fetch_many(self, requests: Sequence[tuple[Any, str]], wait_s: float,
                   max_bytes: Optional[int] = None) -> list[Optional[bytes]]:
        """What each (peer, key) serves, waiting up to ``wait_s`` for a piece to be there."""

    def publish(self, tag: str, key: str, data: bytes, readers: int = 0, settled: bool = True) -> None:
        """Serve ``data`` under ``key``. ``settled``: it answers joins that come after it too (else a join waits for
        the next piece)."""

    def withdraw(self, key: str) -> None:
        """Serve nothing under ``key`` until the next publish."""

    def join(self, peer: Any, key: str, deposit: bytes, wait_s: float,
             max_bytes: Optional[int] = None) -> Optional[bytes]:
        """Leave ``deposit`` with ``peer`` under ``key`` while waiting, in the same request, for the first piece it
        publishes there after the deposit came (or a settled one it has); None: nothing within ``wait_s``."""

    def deposits(self, key: str) -> Mapping[str, bytes]:
        """The deposits of the joins under ``key`` that still wait (peer -> piece)."""

    def wait_deposits(self, seen: int, timeout: float) -> int:
        """Wait up to ``timeout`` for the deposits to change after the ``seen``-th change; -> the changes so far."""


#: a roster lists a group's meetings (a few hundred bytes each): far more than any group's
MAX_ROSTER_BYTES = 256 * 1024
MAX_ROSTER_MEMBERS = 256


@dataclass(frozen=True)
class Roster:
    """What a group's host decided at one of its meetings: the meetings of the peers that go (its own included;
    empty when the meeting did not fill), which planned peers' meetings it read (peer -> attempt), and why."""

    round: int
    attempt: int  # the host's meeting it decides
    members: Mapping[str, bytes]  # peer -> its meeting as the host read it
    seen: Mapping[str, int]
    reason: str

    def encode(self) -> bytes:
        return json.dumps({"round": self.round, "attempt": self.attempt,
                           "members": {peer: data.hex() for peer, data in self.members.items()},
                           "seen": dict(self.seen), "reason": self.reason[:200]}).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Roster":
        """Raises ValueError naming the field for bytes that are not a roster (they come from a peer)."""
        raw = _json_object(data, "roster", MAX_ROSTER_BYTES,
                           {"round": int, "attempt": int, "members": dict, "seen": dict, "reason": str})
        if len(raw["members"]) > MAX_ROSTER_MEMBERS or len(raw["seen"]) > MAX_ROSTER_MEMBERS:
            raise ValueError(f"roster: more than {MAX_ROSTER_MEMBERS} members")
        try:
            members = {str(peer): bytes.fromhex(value) for peer, value in raw["members"].items()}
        except (TypeError, ValueError):
            raise ValueError("roster: members must map peers to hex") from None
        if not all(isinstance(a, int) and not isinstance(a, bool) for a in raw["seen"].values()):
            raise ValueError("roster: seen must map peers to attempts")
        return cls(raw["round"], raw["attempt"], members, {str(p): a for p, a in raw["seen"].items()},
                   raw["reason"][:200])


def decoded(data: Optional[bytes], decode: Callable[[bytes], Any], missing: str,
             bad: str) -> tuple[Any, Optional[Outcome]]:
    """A piece from the host, decoded -> (it, None), or (None, the failed outcome: ``missing`` when nothing came,
    ``bad`` with the decoder's reason when it is not what it should be)."""
    if not data:
        return None, Outcome(False, missing, {})
    try:
        return decode(data), None
    except ValueError as e:
        return None, Outcome(False, f"{bad} ({e})", {})


def decode_answer(piece: bytes) -> tuple[Any, bytes]:
    """What a peer answered a join with -> (its :class:`Roster`, or its :class:`Meeting` when it meets elsewhere; the
    rest riding on it). Raises ValueError for bytes that are neither (they come from a peer)."""
    head, rest = split_piece(piece)
    try:
        return Roster.decode(head), rest
    except ValueError as not_roster:
        try:
            return Meeting.decode(head), rest
        except ValueError:
            raise not_roster from None
