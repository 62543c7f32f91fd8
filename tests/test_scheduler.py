"""The decision after each local step (cotrain.averaging.scheduler), as tables of plain values."""

import pytest

from cotrain.averaging.progress import Action, Decision
from cotrain.averaging.scheduler import TRAIN, Move, Plan, Situation, first_move, settle

AT_H = dict(now=100.0, inner_steps=50, reached_h=True, met_this_round=False, retry_at=0.0, matchmaking_only=False,
            kept_group=False, round=7)


def situation(**changes) -> Situation:
    return Situation(**{**AT_H, **changes})


@pytest.mark.parametrize("changes, expected", [
    # nothing that needs no view: ask the board
    ({}, None),
    ({"reached_h": False}, None),
    # a groupmate waits at our meeting: go at once, and say nothing on the board (it knows), even mid-pause
    ({"waiter": "peer-abcdefgh12345678", "retry_at": 200.0},
     Plan(Move.AVERAGE, "peer 12345678 waits for us at the round's meeting", announce=False)),
    ({"waiter": "peer-abcdefgh12345678", "reached_h": False},
     Plan(Move.AVERAGE, "peer 12345678 waits for us at the round's meeting", announce=False)),
    # the group of the round before meets again once we took H steps, without a view of the board
    ({"kept_group": True}, Plan(Move.AVERAGE, "reached 50 steps: meeting the group of round 6 again", early=True)),
    ({"kept_group": True, "reached_h": False}, None),
    ({"kept_group": True, "met_this_round": True}, None),
    ({"kept_group": True, "matchmaking_only": True}, None),
    ({"kept_group": True, "retry_at": 200.0}, TRAIN),  # a failed round's pause holds it too
    # reasons to train on without reading the view
    ({"retry_at": 200.0}, TRAIN),
    ({"awaiting_read": True}, TRAIN),
    ({"board_unknown": True}, TRAIN),
    ({"view_stale": True}, TRAIN),
])
def test_the_first_move_needs_no_view_of_the_board(changes, expected):
    assert first_move(situation(**changes)) == expected


@pytest.mark.parametrize("action, changes, meets_early, expected", [
    (Action.TRAIN, {}, False, TRAIN),
    (Action.TRAIN, {}, True, Plan(Move.AVERAGE, "reached 50 steps: meeting this round's peers", early=True)),
    (Action.AVERAGE, {}, False, Plan(Move.AVERAGE, "why")),
    (Action.AVERAGE, {}, True, Plan(Move.AVERAGE, "why")),  # the board says so already: an ordinary round
    (Action.RESYNC, {}, False, Plan(Move.RESYNC, "why")),
    # a kept group goes on at its own pace until its meeting fails: a peer ahead is of another group
    (Action.RESYNC, {"kept_group": True}, False, TRAIN),
    (Action.RESYNC, {"kept_group": True, "met_this_round": True}, False, Plan(Move.RESYNC, "why")),
])
def test_the_boards_decision_settles_the_move(action, changes, meets_early, expected):
    assert settle(Decision(action, "why"), situation(**changes), meets_early) == expected
