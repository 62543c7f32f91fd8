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


# ---- next_plan: the whole decision from the round's facts and a view of the board ---------------------------------
import dataclasses  # noqa: E402

from cotrain.averaging.board_view import BoardView  # noqa: E402
from cotrain.averaging.progress import PeerProgress, RoundRules  # noqa: E402
from cotrain.averaging.scheduler import RoundFacts, Rules, kept_group_of, meets_early, next_plan  # noqa: E402

NOW = 1000.0
BOARD = Rules(RoundRules(inner_steps=10, round_wait=30.0, stale_after=4.0), inner_steps=10,
              group_formation="board_only", group_rounds=1, target_group_size=0, sharded=False, run_id="run")


def record(name, round_=3, steps=10, phase="train"):
    return PeerProgress(name, round_, steps, steps * 16, phase, time=NOW)


def facts(steps=10, reached=True, **changes):
    values = dict(me=record("me", steps=steps), reached_h_at=NOW - 1 if reached else None, met_round=-1,
                  retry_at=0.0, reread_after=0.0, kept=None, last_group=())
    return RoundFacts(**{**values, **changes})


def board(*peers, read_at=NOW):
    return BoardView(tuple(peers), read_at, 3, 0, frozenset(p.peer_id for p in peers))


def test_at_h_a_peer_averages_when_the_rounds_peers_are_there_and_meets_early_when_they_are_not_yet():
    plan = next_plan(board(record("me"), record("a")), NOW, facts(), BOARD)
    assert plan.move is Move.AVERAGE and not plan.early
    plan = next_plan(board(record("me"), record("a", steps=5)), NOW, facts(), BOARD)
    assert plan.move is Move.AVERAGE and plan.early
    assert next_plan(board(record("me"), record("a", steps=5)), NOW, facts(met_round=3), BOARD) == TRAIN


def test_before_h_a_peer_trains_on():
    assert next_plan(board(record("me", steps=4), record("a")), NOW, facts(steps=4, reached=False), BOARD) == TRAIN


def test_a_peer_ahead_sends_a_peer_behind_to_download_its_state():
    plan = next_plan(board(record("me", steps=4), record("a", round_=5)), NOW, facts(steps=4, reached=False), BOARD)
    assert plan.move is Move.RESYNC


def test_a_read_still_to_come_after_a_failed_meeting_keeps_the_peer_training():
    assert next_plan(board(record("me"), record("a"), read_at=NOW - 1), NOW, facts(reread_after=NOW - 0.5),
                     BOARD) == TRAIN


def test_the_group_of_the_round_before_meets_again_without_a_look_at_the_others():
    rules = dataclasses.replace(BOARD, group_rounds=4)
    kept = facts(kept=(2, ["a", "me"]))
    view = board(record("me"), record("a", steps=3), record("b", round_=3))
    assert kept_group_of(view, kept, rules) == ["a", "me"]
    assert kept_group_of(view, kept, BOARD) is None  # group_rounds = 1: every round plans anew
    plan = next_plan(view, NOW, kept, rules)
    assert plan.move is Move.AVERAGE and plan.early
    assert not meets_early(view, NOW, facts(met_round=3), rules)  # one early meeting a round
