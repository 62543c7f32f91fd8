"""Who averages with whom: every peer computes the same groups for a round from the progress board, without a timer.

hivemind's matchmaking assembles a group by waiting ``matchmaking_time`` for followers: every round paid that
timer before a byte moved. But the progress board already says who is at which round, so each peer of the round
can compute the groups itself (:func:`plan_groups`: the round's peers in a fixed order, shuffled by a seed every
peer knows and cut into groups of ``target_group_size``; on a sharded board, :func:`plan_arrival_groups`: the
shard's peers in the order they came to the round), keep the group of the round before for a few rounds
(:func:`kept_group`), and name the group's host (:func:`host_of`: one of its members that can be dialled). The
members then meet at the host (:mod:`cotrain.averaging.meeting`).
"""

from __future__ import annotations

import hashlib
import random
from typing import Callable, Optional, Sequence


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


def plan_arrival_groups(arrivals: Sequence[tuple[float, str]], target_group_size: int) -> list[list[str]]:
    """The groups of a round in one shard of a sharded board: its peers in the order they came to the round
    (``arrivals``: (when each began the round, its id); ties by id), cut into consecutive groups of
    ``target_group_size`` (0: one group). A last group of one stays one: it can form no group until a next peer
    comes (merging it into the group before would change that group back and forth with every newcomer).

    Why not :func:`plan_groups`' shuffle: the peers of a shard come to a round one after another, and each plans
    from the view of its last read. A shuffle of the whole round changes every group with every newcomer, so two
    peers that differed by one arrival disagreed on all groups: at 32 nodes (bench/scale.py) over a quarter of
    the board's meetings failed on "planned another group". In arrival order a newcomer only joins the last group or
    starts one: views that differ in who came last agree on every group before. Mixing across the swarm comes
    from the shards, dealt afresh every round (:func:`cotrain.averaging.progress.shard_of`)."""
    came: dict[str, float] = {}
    for since, peer in arrivals:  # one place a peer (its earliest, should a view hold two)
        came[peer] = min(since, came.get(peer, since))
    members = sorted(came, key=lambda peer: (came[peer], peer))
    if not members:
        return []
    size = target_group_size if target_group_size > 0 else len(members)
    return [members[i:i + size] for i in range(0, len(members), size)]


def kept_group(kept: Optional[tuple[int, Sequence[str]]], round_number: int, group_rounds: int,
               present: Optional[Callable[[str], bool]] = None, me: str = "") -> Optional[list[str]]:
    """The group that averaged at the round before, when it stays together for ``round_number``
    (averaging.group_rounds > 1, and ``round_number`` is no multiple of it): its members, as the host's roster listed
    them, so that all of them plan the same group without reading the board. ``kept``: (the round it met at, its
    members), or None. None: plan this round's groups from the board.

    ``present(peer)``: whether the board still shows a member (a live record). A group none of whose other members
    (``me`` is this peer) is still there is no group: its members went ahead and left the swarm, and a peer that
    kept meeting them waited for a host that never came, round after round."""
    if group_rounds <= 1 or kept is None or kept[0] != round_number - 1 or round_number % group_rounds == 0:
        return None
    if present is not None and not any(present(peer) for peer in kept[1] if peer != me):
        return None
    return list(kept[1])


def group_of(me: str, groups: Sequence[Sequence[str]]) -> list[str]:
    return next((list(g) for g in groups if me in g), [me])


def host_of(members: Sequence[str], dialable: Callable[[str], bool], turn: Optional[str] = None) -> Optional[str]:
    """The planned group's host: of its members that peers can dial, the first in the plan's order, or with a
    ``turn`` (a string every member knows, the run and round) the one that ``turn`` draws (the highest hash of
    (turn, peer)); None when none can be dialled (then nobody could reach anybody's meeting, nor reduce a part).

    The host reduces a small update (allreduce.hosted) and could return anything for it, so the turn moves the
    task round to round, as the butterfly's single reducer moves. Either way a peer that planned one more member or
    one fewer names the same host unless that member is the host (a chance of 1 in the group's size), and the first
    of an arrival order stays first when a newcomer comes after it (sharded boards keep that order)."""
    reachable = [peer for peer in members if dialable(peer)]
    if not reachable or turn is None:
        return reachable[0] if reachable else None
    return max(reachable, key=lambda peer: hashlib.sha1(f"{turn}|{peer}".encode()).digest())
