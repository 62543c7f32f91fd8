"""When a peer ends its round: the decision after each local step, as pure functions of plain values.

After every local step (and once a round run in the background came back), :class:`~cotrain.averaging.rounds.
RoundAverager` gathers a :class:`Situation` and asks :func:`first_move`, which needs no look at the progress
board's view: a groupmate waiting at this peer's meeting, the group of the round before meeting again, or a reason
to train on without reading the view (a pause after a failed round, a read of the board still to come). Otherwise
it asks :func:`round_decision` (:mod:`cotrain.averaging.progress`) about the view, and :func:`settle` turns that
decision into the move. Every function returns a :class:`Plan`: the move and the reason in words (the node's log
line and ``swarm status`` show it).

The moves::

    TRAIN       keep taking local steps
    AVERAGE     end the round: form a group and average. ``early``: a meeting already planned (the group of the
                round before meets again, or this peer just took its H steps and its planned group can meet now):
                if it does not fill, the peer trains on (no matchmaking, no pause). ``announce``: say on the board
                first that the round ends (not when a groupmate already waits at this peer's meeting: it knows)
    RESYNC      a peer is ahead: download the shared state
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from cotrain.averaging.board_view import (BoardView, awaiting_read, board_group, board_time, board_unknown,
                                          fresh_view_due, kept_roster, peers_behind, round_split, view_stale)
from cotrain.averaging.progress import Action, Decision, PeerProgress, RoundRules, round_decision


class Move(enum.Enum):
    TRAIN = "train"
    AVERAGE = "average"
    RESYNC = "resync"


@dataclass(frozen=True)
class Plan:
    move: Move
    reason: str = ""
    early: bool = False
    announce: bool = True


TRAIN = Plan(Move.TRAIN)


@dataclass(frozen=True)
class Situation:
    """What the peer knows after a local step, as values."""

    now: float
    inner_steps: int
    #: this peer took its H steps in this round
    reached_h: bool
    #: this peer went to a meeting in this round already (one early meeting a round)
    met_this_round: bool
    #: no new try before this time (a failed round's pause)
    retry_at: float
    #: averaging.group_formation = "matchmaking": no meetings on the board
    matchmaking_only: bool
    #: the group of the round before stays together for this round (averaging.group_rounds)
    kept_group: bool
    #: this peer's round
    round: int = 0
    #: a peer of this round that asked for this peer's meeting while it trained (its id)
    waiter: Optional[str] = None
    #: after a meeting whose groupmates had planned another group: a read of the board begun since is awaited
    awaiting_read: bool = False
    #: no read of the board came in for a record's life: this peer does not know who is there
    board_unknown: bool = False
    #: a sharded board's view is of the round before's shard
    view_stale: bool = False


def first_move(s: Situation) -> Optional[Plan]:
    """The move that needs no look at the board's view, or None: ask :func:`round_decision`, then :func:`settle`."""
    if s.waiter is not None:
        return Plan(Move.AVERAGE, f"peer {s.waiter[-8:]} waits for us at the round's meeting", announce=False)
    if s.reached_h and not s.met_this_round and s.now >= s.retry_at and not s.matchmaking_only and s.kept_group:
        # no view of the board to wait for: a sharded board is read afresh at every round, and at 32 nodes on 2
        # cores reads took seconds, or timed out
        return Plan(Move.AVERAGE, f"reached {s.inner_steps} steps: meeting the group of round {s.round - 1} again",
                    early=True)
    if s.now < s.retry_at:
        return TRAIN
    if s.awaiting_read or s.board_unknown or s.view_stale:
        # a peer that does not know who is there trains on rather than ending rounds by itself (16 nodes on 2
        # cores whose reads timed out concluded they were alone and ran ahead on a state nobody shared)
        return TRAIN
    return None


def reads_paused(kept_group: bool, met_this_round: bool) -> bool:
    """Whether this peer skips its reads of the board: its group of the round before meets again from its roster,
    and the meeting of this round has not been held (once it failed, the peer reads again to plan anew). The view
    would go unused (a peer ahead is not followed while the group holds, and a deal's first round reads its new shard
    afresh anyway, see board_view.view_stale); the peer goes on publishing its record. Every read is a DHT traversal
    that the replicas it visits answer, and at 32 nodes on a sixteenth of a core each the DHT process and libp2p
    daemon took 0.031 CPUs of a node's 0.056, its training 0.024 (bench/scale.py, /proc over 40 s); at 4 nodes 0.014
    and 0.037."""
    return kept_group and not met_this_round


def settle(decision: Decision, s: Situation, meets_early: bool) -> Plan:
    """The move for :func:`round_decision`'s ``decision`` about the board's view. ``meets_early``: this peer took
    its H steps and its planned group can meet now (:func:`meets_early`); it goes to the meeting rather than
    wait until the board shows the others at H."""
    if decision.action is Action.TRAIN:
        if meets_early:
            return Plan(Move.AVERAGE, f"reached {s.inner_steps} steps: meeting this round's peers", early=True)
        return TRAIN
    if decision.action is Action.RESYNC:
        if s.kept_group and not s.met_this_round:
            # the group of the round before goes on at its own pace until its meeting fails: a peer ahead is of
            # another group, and taking its state would leave this group one member short (at 32 nodes, members
            # that went ahead by download left their groups waiting for them at every round)
            return TRAIN
        return Plan(Move.RESYNC, decision.reason)
    return Plan(Move.AVERAGE, decision.reason)


# ---- the whole decision, from the peer's round and its view of the board ------------------------------------------
@dataclass(frozen=True)
class Rules:
    """What the config says about when rounds end and who meets."""

    rules: RoundRules
    inner_steps: int
    group_formation: str
    group_rounds: int
    target_group_size: int
    sharded: bool
    run_id: str


@dataclass(frozen=True)
class RoundFacts:
    """This peer's round as values, taken once for a decision (the front's :meth:`RoundAverager.facts`)."""

    me: PeerProgress
    reached_h_at: Optional[float]
    met_round: int
    retry_at: float
    #: a round failed because a groupmate planned otherwise: wait for a read of the board begun after this time
    reread_after: float
    #: (round, its group) of the last round this peer's group met at on the board
    kept: Optional[tuple[int, Sequence[str]]]
    last_group: Sequence[str]
    #: a peer of this round that asked for this peer's meeting while it trained (its id)
    waiter: Optional[str] = None

    @property
    def round(self) -> int:
        return self.me.round


def kept_group_of(view: BoardView, f: RoundFacts, r: Rules) -> Optional[list[str]]:
    """The group of the round before when it meets again this round (board_view.kept_roster), or None."""
    return kept_roster(view, f.kept, f.round, r.group_rounds, f.me.peer_id)


def board_group_of(view: BoardView, now: float, f: RoundFacts, r: Rules) -> Optional[tuple[list[str], str]]:
    """This peer's planned group of the round and its host (board_view.board_group), or None."""
    return _board_group(view, now, f, r, kept_group_of(view, f, r))


def _board_group(view: BoardView, now: float, f: RoundFacts, r: Rules,
                 kept: Optional[list[str]]) -> Optional[tuple[list[str], str]]:
    return board_group(view, now, f.me, r.rules, kept=kept, last_group=f.last_group, sharded=r.sharded,
                       target_group_size=r.target_group_size, run_id=r.run_id)


def meets_early(view: BoardView, now: float, f: RoundFacts, r: Rules) -> bool:
    """With board groups, a peer that took its H steps goes to the round's meeting at once (once a round): peers that
    get there together start the all-reduce a round trip after the last one, instead of a board read or two later
    (rounds paced by progress_interval). A meeting that does not fill (a slower peer) sends it back to training, and
    round_decision's waiting goes on as without it."""
    kept = kept_group_of(view, f, r)
    split = round_split(view, now, f.me, r.rules, r.sharded, r.target_group_size)
    return _meets_early(view, now, f, r, kept, split, lambda: _board_group(view, now, f, r, kept))


def _meets_early(view: BoardView, now: float, f: RoundFacts, r: Rules, kept: Optional[list[str]], split: bool,
                 planned: Callable[[], Optional[tuple[list[str], str]]]) -> bool:
    return (r.group_formation != "matchmaking" and f.reached_h_at is not None and f.met_round != f.round
            and not fresh_view_due(view, r.sharded, f.reached_h_at, kept is not None)
            and not peers_behind(view, now, f.me, r.rules, split, f.last_group)
            and planned() is not None)


def next_plan(view: BoardView, now: float, f: RoundFacts, r: Rules) -> Plan:
    """The move after a local step: :func:`first_move`, else :func:`round_decision` about the view, settled. The
    kept group, the split and the planned group are each worked out once (this runs after every local step)."""
    kept = kept_group_of(view, f, r)
    situation = Situation(now, r.inner_steps, reached_h=f.reached_h_at is not None,
                          met_this_round=f.met_round == f.round, retry_at=f.retry_at,
                          matchmaking_only=r.group_formation == "matchmaking",
                          kept_group=kept is not None, round=f.round, waiter=f.waiter,
                          awaiting_read=awaiting_read(view, now, f.reread_after, r.rules),
                          board_unknown=board_unknown(view, now, r.rules),
                          view_stale=view_stale(view, r.sharded, f.round))
    plan = first_move(situation)
    if plan is not None:
        return plan
    board_now = board_time(view, now, r.rules)
    split = round_split(view, board_now, f.me, r.rules, r.sharded, r.target_group_size)
    planned: list = []  # the planned group, once asked for

    def plan_once() -> Optional[tuple[list[str], str]]:
        if not planned:
            planned.append(_board_group(view, board_now, f, r, kept))
        return planned[0]

    group = plan_once() if split and f.reached_h_at is not None else None
    decision = round_decision(board_now, f.me, view.peers, r.rules, f.reached_h_at, alone_waits=r.sharded,
                              split=split, group=None if group is None else group[0])
    return settle(decision, situation, decision.action is Action.TRAIN
                  and _meets_early(view, board_now, f, r, kept, split, plan_once))
