"""This peer's side of a board group's meeting (:func:`hold_meeting`): as the group's host, it takes in its
groupmates' meetings and decides who goes; as a member, it joins the host and waits for its roster, or follows the
host elsewhere. The messages and the decision itself are :mod:`cotrain.averaging.meeting`'s."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Mapping, Optional

from cotrain.averaging.meeting import (MAX_ROSTER_BYTES, Meeting, Outcome, Roster, Transport, decode_answer, decoded,
                                       join_piece, meeting_key, meeting_outcome, meeting_piece_bound,
                                       meeting_tag, piece_bound, split_piece)


#: how often a host waiting for its planned groupmates' joins looks again at who left the swarm (the board says so)
GONE_POLL_S = 0.25
#: how often a host asks the planned groupmates that have not joined it what they do instead (a peer meeting elsewhere
#: answers with its meeting: its view of the board differs, and the meeting need not wait for it); the first time
#: GONE_POLL_S after it came. In a group that meets round after round everyone joins within it, and nobody is asked
ASK_MISSING_S = 0.5


def hold_meeting(transport: Transport, me: str, mine: Meeting, host: str, peers: Mapping[str, Any], wait_s: float,
                 go_wait_s: float, admitted: Callable[[str, bytes], bool],
                 stop: Optional[threading.Event] = None, subset: bool = False,
                 gone: Callable[[str], bool] = lambda peer: False, walk_ins: bool = False, target: int = 0,
                 follow: Callable[[str], Optional[tuple[str, Any]]] = lambda group: None, payload: bytes = b"",
                 reduce: Optional[Callable[[dict[str, bytes]], bytes]] = None, max_rest: int = 0,
                 dialable: Callable[[str], bool] = lambda peer: True) -> Outcome:
    """This peer's side of a board group's meeting, whose ``host`` (:func:`~cotrain.averaging.groups.host_of`) decides who goes.

    A member joins the host (:meth:`Transport.join`): one request that carries its meeting ``mine`` (naming the
    host: :func:`host_key`) and waits up to ``wait_s`` + ``go_wait_s`` for the host's :class:`Roster`. The host reads
    its planned groupmates' meetings from their joins (``peers``: id -> transport address, ``me`` excluded) for up
    to ``wait_s``, decides (:func:`meeting_outcome`) and publishes the roster, which answers every join waiting; the
    members go when it lists them, with the meetings it lists. A round is one request a member (it was three: the
    host fetched each meeting, each member fetched the host's meeting and then its roster), and nobody dials a
    member: members behind NAT, who cannot be dialled, meet through a host they can dial. One peer decides, so the
    members that go all go with the same group, and two peers that plan differently (one read the board before a
    newcomer came) still meet when they name the same host and the host planned them.
    ``subset``: the host goes with the planned peers that came and agree, without the others.
    ``gone(peer)``: a planned groupmate left the swarm since the plan (the board says so): not waited for. A planned
    groupmate that has not joined is asked what it does (every :data:`ASK_MISSING_S`, when ``dialable(peer)``: not
    behind NAT): one that meets elsewhere is not waited for either, and the meeting fails as "planned another group"
    (or, with ``subset``, goes without it).

    Views of the board differ, so a host with ``walk_ins`` also takes the peers that joined it unplanned into its
    group, up to ``target``'s bound (see :func:`meeting_outcome`). A member meeting elsewhere puts its own meeting
    where its joins are answered, so a peer whose view made it host learns where it went, and follows it there once
    when ``follow(group)`` -> (that host's id, address) (its view knows that host; the host had seen an earlier peer
    that the member had not).

    A hosted all-reduce (:func:`cotrain.averaging.allreduce.hosted`) rides with the meeting: every member's
    ``payload`` (its contribution) goes with its meeting, the host calls ``reduce(payloads)`` (peer -> payload of
    those that go, its own included) and sends what it returns with its roster, as ``Outcome.result``.
    ``max_rest``: the most bytes either may hold (a piece from a peer that holds more is none).
    """
    if me == host:
        return _host_meeting(transport, me, mine, peers, wait_s, admitted, stop, subset, gone, walk_ins, target,
                             payload, reduce, max_rest, dialable)
    tag, key = meeting_tag(mine.round), meeting_key(mine.round)
    transport.publish(tag, key, mine.encode())  # for the peers whose view made us their host: we meet elsewhere
    outcome = _joined(transport, me, mine, host, peers[host], wait_s, go_wait_s, admitted, stop, gone, follow,
                      payload, max_rest)
    if not outcome.ok:  # a peer joining us waits for what we do next in the round
        transport.withdraw(key)
    return outcome


def _host_meeting(transport: Transport, me: str, mine: Meeting, peers: Mapping[str, Any], wait_s: float,
                  admitted, stop, subset: bool, gone, walk_ins: bool, target: int, payload: bytes = b"",
                  reduce: Optional[Callable[[dict[str, bytes]], bytes]] = None, max_rest: int = 0,
                  dialable: Callable[[str], bool] = lambda peer: True) -> Outcome:
    tag, key = meeting_tag(mine.round), meeting_key(mine.round)
    stop = stop or threading.Event()
    started = time.monotonic()
    deadline, ask_at = started + wait_s, started + GONE_POLL_S
    bound = meeting_piece_bound(max_rest)
    elsewhere: dict[str, bytes] = {}  # planned peers that meet elsewhere -> their meetings (naming another host)
    came = True  # a join came (or went) since the last look
    while True:
        changes = transport.wait_deposits(-1, 0.0)  # a join after this read wakes the wait below
        joined = {peer: data for peer, data in transport.deposits(key).items() if peer != me and len(data) <= bound}
        received = {peer: joined.get(peer) or elsewhere.get(peer) for peer in peers}
        walked = {peer: data for peer, data in joined.items() if peer not in peers} if walk_ins else {}
        missing = [peer for peer in peers if not received.get(peer) and not gone(peer)]
        now = time.monotonic()
        left = deadline - now
        if not missing or left <= 0 or stop.is_set():
            break
        if now >= ask_at:
            ask_at = now + ASK_MISSING_S
            elsewhere.update(_meeting_elsewhere(transport, mine, {p: peers[p] for p in missing if dialable(p)},
                                                piece_bound(MAX_ROSTER_BYTES, max_rest)))
            if any(p in elsewhere for p in missing):
                continue
        if not came and walked and meeting_outcome(me, mine, [me, *peers], received, admitted, walk_ins=walked,
                                                   target=target).ok:
            # a full group with walk-ins, and nobody came for GONE_POLL_S: no need to wait for the planned peers
            # that did not come
            break
        came = transport.wait_deposits(changes, min(left, GONE_POLL_S)) != changes
    outcome = meeting_outcome(me, mine, [me, *peers], received, admitted, subset=subset, walk_ins=walked,
                              target=target)
    seen, payloads = {}, {me: payload}
    for peer, data in {**walked, **received}.items():
        try:
            head, rest = split_piece(data) if data else (b"", b"")
            seen[peer] = Meeting.decode(head).attempt if data else None
            payloads[peer] = rest
        except ValueError:
            pass
    members = {peer: m.encode() for peer, m in outcome.meetings.items()} if outcome.ok else {}
    result = b""
    if outcome.ok and reduce is not None:
        result = reduce({peer: payloads.get(peer, b"") for peer in outcome.meetings})
        outcome = dataclasses.replace(outcome, result=result)
    # answers the joins waiting. A meeting that went is settled: a join that comes later learns it went without it
    # (and a leaving host waits until its members have read it); one that did not fill is not: joins that come after
    # it wait for this host's next meeting of the round
    transport.publish(tag, key, join_piece(Roster(
        mine.round, mine.attempt, members, {p: a for p, a in seen.items() if a is not None}, outcome.reason).encode(),
        result), readers=max(0, len(members) - 1), settled=outcome.ok)
    return outcome


def _meeting_elsewhere(transport: Transport, mine: Meeting, peers: Mapping[str, Any],
                       max_bytes: int) -> dict[str, bytes]:
    """Ask ``peers`` (id -> address) what they do at ``mine``'s round now -> those that meet elsewhere: peer -> its
    meeting (a member's, or its own as the host of its roster), naming another host."""
    if not peers:
        return {}
    out = {}
    got = transport.fetch_many([(address, meeting_key(mine.round)) for address in peers.values()], wait_s=0.0,
                               max_bytes=max_bytes)
    for peer, data in zip(peers, got):
        try:
            answer = decode_answer(data)[0] if data else None
        except ValueError:
            continue
        meeting = answer.members.get(peer) if isinstance(answer, Roster) else answer
        try:
            meeting = Meeting.decode(meeting) if isinstance(meeting, bytes) else meeting
        except ValueError:
            continue
        if meeting is not None and meeting.round == mine.round and meeting.group != mine.group:
            out[peer] = meeting.encode()
    return out


def _joined(transport: Transport, me: str, mine: Meeting, host: str, address: Any, wait_s: float,
            go_wait_s: float, admitted, stop, gone, follow=lambda group: None, payload: bytes = b"",
            max_rest: int = 0) -> Outcome:
    who = f"the group's host {host[-8:]}"
    stop = stop or threading.Event()
    deadline = time.monotonic() + wait_s + go_wait_s
    deposit = join_piece(mine.encode(), payload)
    data = None
    # a peer reachable only over a connection it opens (behind NAT) answers once it has come to the round: a join
    # that failed at once is made again while time remains
    while not data and not stop.is_set() and not gone(host) and time.monotonic() < deadline:
        data = transport.join(address, meeting_key(mine.round), deposit, deadline - time.monotonic(),
                              max_bytes=piece_bound(MAX_ROSTER_BYTES, max_rest))
        if not data:
            stop.wait(min(0.1, max(0.0, deadline - time.monotonic())))
    answer, failed = decoded(data, decode_answer, f"{who} did not come to the round's meeting",
                              f"{who} sent no roster")
    if failed is not None:
        return failed
    if isinstance(answer[0], Meeting):  # it meets elsewhere: its view differs from ours
        hosted = answer[0]
        if hosted.round == mine.round and hosted.group != mine.group:
            there = follow(hosted.group)
            if there is not None and there[0] not in (me, host):  # once: the host it names hosts its own group
                moved = dataclasses.replace(mine, group=hosted.group)
                transport.publish(meeting_tag(mine.round), meeting_key(mine.round), moved.encode())
                return _joined(transport, me, moved, there[0], there[1], wait_s, go_wait_s, admitted, stop, gone,
                               payload=payload, max_rest=max_rest)
        return Outcome(False, f"{who} planned another group (round {hosted.round})", {}, disagreed=True)
    roster, result = answer
    if roster.round != mine.round:
        return Outcome(False, f"{who} sent the roster of another round", {})
    if me not in roster.members:
        if not roster.members:
            return Outcome(False, f"{who}'s meeting did not fill ({roster.reason})", {})
        # it did not plan us, or our meeting came too late: either way its view of the round is not ours
        return Outcome(False, f"{who} went without us ({len(roster.members)} peers)", {},
                       disagreed=me not in roster.seen)
    meetings = {me: mine}
    for peer, data in roster.members.items():
        if peer == me:
            continue
        try:
            meeting = Meeting.decode(data)
        except ValueError as e:
            return Outcome(False, f"{who} listed a member without a meeting ({e})", {})
        if meeting.round != mine.round or meeting.group != mine.group or not admitted(peer, meeting.cred):
            return Outcome(False, f"{who} listed peer {peer[-8:]}, which is not of this meeting", {})
        meetings[peer] = meeting
    if host not in meetings:
        return Outcome(False, f"{who} listed a group without itself", {})
    return Outcome(True, f"{len(meetings)} peers met at {who}'s meeting", meetings, result=result)
