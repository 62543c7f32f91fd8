"""A peer's view of the progress board, and what its rounds conclude from it, as pure functions of plain values.

The publisher (:class:`~cotrain.averaging.board_publisher.BoardPublisher`) reads the board on its own thread and
hands the result over as one :class:`BoardView`, a frozen value it replaces whole: the round's code takes the view
once and judges everything from it, so no decision mixes two reads (the records of one and the read time of another).
The functions here take the view, the peer's own values (its :class:`PeerProgress`, its last group) and the run's
rules; :class:`~cotrain.averaging.rounds.RoundAverager` calls them with its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Optional, Sequence

from cotrain.averaging.groups import group_of, host_of, kept_group, plan_arrival_groups, plan_groups
from cotrain.averaging.progress import (Phase, PeerProgress, RoundRules, board_steady, groups_split, live_peers,
                                        round_peers)


@dataclass(frozen=True)
class BoardView:
    """One read of the board: its records, and what the reads so far say about them."""

    peers: tuple[PeerProgress, ...] = ()
    #: when the read that returned ``peers`` began (time.time(); 0: no read came in yet)
    read_at: float = 0.0
    #: the round whose shard ``peers`` was read from (-1: none yet)
    view_round: int = -1
    #: how many reads in a row before this one showed the same live peers (:func:`view_steady`)
    same_reads: int = 0
    #: the live peers (ids) of this read: every record but those that said they left
    last_live: frozenset = frozenset()


def next_view(before: BoardView, peers: Sequence[PeerProgress], read_at: float, view_round: int) -> BoardView:
    """The view after a read that began at ``read_at`` in the shard of ``view_round`` returned ``peers``."""
    live = frozenset(p.peer_id for p in peers if p.phase != Phase.LEFT)
    return BoardView(tuple(peers), read_at, view_round, before.same_reads + 1 if live == before.last_live else 0,
                     live)


def board_unknown(view: BoardView, now: float, rules: RoundRules) -> bool:
    """No read of the board came in for ``stale_after``: this peer does not know who is there, so it trains on
    rather than ending rounds by itself. With 16 nodes on 2 cores nodes whose reads timed out concluded they
    were alone, averaged by themselves and ran ahead on a state nobody shared (thrown away at their next resync);
    a peer whose DHT is down keeps its local progress for when it is back."""
    return now - view.read_at > rules.stale_after


def view_stale(view: BoardView, sharded: bool, round_number: int) -> bool:
    """A sharded board's view is of the shard of the round it was read at: once the round moved on, it shows
    last round's shardmates, not this round's. Train on until the new round's shard is read."""
    return sharded and view.view_round != round_number


def awaiting_read(view: BoardView, now: float, reread_after: float, rules: RoundRules) -> bool:
    """After a meeting whose groupmates had planned another group (at ``reread_after``): no new try until a read of
    the board that began since has come in (at most ``stale_after``, should reads fail). Before this a newcomer to a
    fast swarm never caught up: the others' group formed without it, it fell back to matchmaking alone (seconds),
    and by then they were many rounds on."""
    return view.read_at <= reread_after and now < reread_after + rules.stale_after


def board_time(view: BoardView, now: float, rules: RoundRules) -> float:
    """The time the board's records are judged at: when its last read began, so that a slow read does not make
    every peer look gone (8 nodes on 2 cores took seconds to read it, and nodes concluded they were alone and
    averaged by themselves); once no read has come for ``stale_after``, time moves on again, so that the peers
    of a DHT this node cannot reach do go stale."""
    return max(min(now, view.read_at), now - rules.stale_after)


def round_split(view: BoardView, now: float, me: PeerProgress, rules: RoundRules, sharded: bool,
                target_group_size: int) -> bool:
    """The round's peers average in several groups: the board is sharded, or it shows more live peers than
    ``target_group_size`` (see round_decision's ``split``)."""
    return groups_split(sharded, target_group_size, len(live_peers(now, me, view.peers, rules)))


def peers_behind(view: BoardView, now: float, me: PeerProgress, rules: RoundRules, split: bool,
                 last_group: Collection[str]) -> bool:
    """A live peer the board shows at an earlier round (a node that just joined or came back, resynchronising):
    round_decision waits for it (up to round_wait), and so must the early meeting. Meeting at once without it, a
    fast swarm (rounds shorter than a board read) left a returning node behind round after round. ``split``
    (:func:`round_split`): a peer one round behind finishes it with its own group. The groupmates of the round
    this peer just averaged (``last_group``) are coming, though their records show them behind."""
    lag = 2 if split else 1
    return any(p.round <= me.round - lag and p.phase != Phase.PAUSED and p.peer_id not in last_group
               for p in live_peers(now, me, view.peers, rules))


def kept_roster(view: BoardView, kept: Optional[tuple[int, Sequence[str]]], round_number: int, group_rounds: int,
                me: str) -> Optional[list[str]]:
    """The group this peer averaged with at the round before, when it stays together for this round
    (averaging.group_rounds > 1, and this round is no multiple of it): every member, this one included, as the
    host's roster listed them, so that all of them plan the same group without reading the board. None when
    groups are planned from the board this round, or when none of its other members is on the board any more: the
    last read showed none of them (their records expired) or showed them gone. Not judged by the records' age:
    while the group is kept, reads pause (RoundAverager._reads_paused) and its members' records only grow older."""
    present = {p.peer_id for p in view.peers if p.phase != Phase.LEFT}
    return kept_group(kept, round_number, group_rounds, present=present.__contains__, me=me)


def fresh_view_due(view: BoardView, sharded: bool, reached_h_at: Optional[float], kept: bool) -> bool:
    """On a sharded board the early meeting waits for a read of the shard begun once this peer took its H steps
    (the publisher is woken then): the view it came to the round with shows only the peers that came before
    it, and it would plan its group without those that came since. ``kept``: its group of the round before meets
    again from its roster, and needs no view."""
    return sharded and reached_h_at is not None and view.read_at < reached_h_at and not kept


def host_turn(run_id: str, round_number: int) -> str:
    """What draws the host of an unsharded or kept group (groups.host_of): the run and the round."""
    return f"{run_id}/{round_number}"


def board_group(view: BoardView, now: float, me: PeerProgress, rules: RoundRules, *,
                kept: Optional[Sequence[str]], last_group: Collection[str], sharded: bool, target_group_size: int,
                run_id: str) -> Optional[tuple[list[str], str]]:
    """This peer's planned group for the round, from the board, and its host (groups.host_of: a member that can
    be dialled); None when it cannot meet: nobody else is there, or none of its members can be dialled
    (all behind NAT: nobody could fetch a meeting; every member sees the same flags on the board, so none of
    them meets, or with "board" they all go to matchmaking together). Members behind NAT meet through the host,
    never fetching each other. ``kept``: the roster of the group of the round before when it meets again
    (:func:`kept_roster`); ``me.reducer`` False: this peer cannot be dialled either."""
    dial_out_only = {p.peer_id for p in view.peers if not p.reducer} | ({me.peer_id} if not me.reducer else set())
    if kept is not None:  # the group of the round before meets again: its roster is the plan
        gone = {p.peer_id for p in view.peers if p.phase == Phase.LEFT}
        members = [peer for peer in kept if peer not in gone]
        host = host_of(members, lambda peer: peer not in dial_out_only, host_turn(run_id, me.round))
        return (members, host) if len(members) >= 2 and host is not None else None
    # on a sharded board last round's groupmates are in other shards now: only this round's shard counts
    here = round_peers(now, me, view.peers, rules, () if sharded else last_group)
    if sharded:  # the shard's peers in the order they came: a newcomer changes no group but the last
        since = {p.peer_id: p.since for p in view.peers}
        groups = plan_arrival_groups([(me.since, me.peer_id), *((since[p], p) for p in here)], target_group_size)
    else:
        groups = plan_groups(me.round, [me.peer_id, *here], target_group_size, run_id)
    members = group_of(me.peer_id, groups)
    if members == [me.peer_id] and len(groups) > 1:
        # the last of the shard's arrivals, alone: walk into the group before (its host takes walk-ins up to
        # meeting.max_group_size), rather than wait for a next peer that may not come this round. Its members'
        # plans stay as they were: only this peer plans the bigger group
        members = [*groups[-2], me.peer_id]
    # a sharded round's host is the first of its arrival order (a walk-in, last, keeps it); a shuffled plan's
    # takes turns
    host = host_of(members, lambda peer: peer not in dial_out_only, None if sharded else host_turn(run_id, me.round))
    if len(members) < 2 or host is None:
        return None
    return members, host


def view_steady(view: BoardView, sharded: bool, me: str, last_group: Collection[str]) -> bool:
    """The board has nothing new to say (:func:`~cotrain.averaging.progress.board_steady`): the publisher stores
    and reads every STEADY_STRETCH intervals (cotrain.averaging.board_publisher)."""
    return board_steady(sharded, view.same_reads, view.last_live, me, last_group)
