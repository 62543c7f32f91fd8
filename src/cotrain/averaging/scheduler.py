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
from typing import Optional

from cotrain.averaging.progress import Action, Decision


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
    and the meeting of this round has not been held (once it failed, the peer reads again to plan anew)."""
    return kept_group and not met_this_round


def settle(decision: Decision, s: Situation, meets_early: bool) -> Plan:
    """The move for :func:`round_decision`'s ``decision`` about the board's view. ``meets_early``: this peer took
    its H steps and its planned group can meet now (RoundAverager._meets_early); it goes to the meeting rather than
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
