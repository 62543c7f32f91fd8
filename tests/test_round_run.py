"""One round's network side (cotrain.averaging.round_run) with a mocked group former and reduction, in the style
torchft tests its Manager: what the round returns, and which parts it asked, for each way a round can go."""

from unittest.mock import create_autospec

import pytest
import torch

from cotrain.averaging.allreduce import AllReduceFailed
from cotrain.averaging.formation import Formation, Formed, GroupFormer
from cotrain.averaging.outcome import Kind
from cotrain.averaging.overlap import PendingRound
from cotrain.averaging.reduction import Hosting, Reduced, Reduction
from cotrain.averaging.round_run import RoundRun
from cotrain.config import AveragingConfig

ME, A, B = "peer-me", "peer-a", "peer-b"
HASH = "h-same"


def launch(**changes) -> PendingRound:
    values = dict(round=7, steps=50, samples=800, reached_h_at=1.0, contribution=[torch.ones(3)], early=False,
                  seen=3, swarm=10_000, contributed=2_000, claimed=800)
    return PendingRound(**{**values, **changes})


def said(samples=800, hash=HASH, swarm=10_000, contributed=2_000) -> dict:
    return dict(round=7, samples=samples, hash=hash, reducer=True, swarm=swarm, contributed=contributed)


def formed(info=None, from_board=True, group=(ME, A, B)) -> Formation:
    info = info if info is not None else {p: said() for p in group}
    return Formation(Formed(sorted(group), info, from_board=from_board), went=True)


class Round:
    """A RoundRun over mocks, and what it reported through its callbacks."""

    def __init__(self, averager=True, met_round=-1, **cfg):
        self.cfg = AveragingConfig(**cfg)
        self.former = create_autospec(GroupFormer, instance=True)
        self.former.met_round = met_round
        self.former.averager = object() if averager else None
        self.reduction = create_autospec(Reduction, instance=True)
        self.reduction.hosting.return_value = None
        self.reduction.allreduce.return_value = Reduced([torch.full((3,), 2.0)], True)
        self.dropped, self.credits, self.copies = [], [], 0
        self.run = RoundRun(ME, self.cfg, self.former, self.reduction, self._copy,
                            lambda r, d: self.dropped.append((r, dict(d))),
                            lambda r, claimed, credited: self.credits.append((r, dict(claimed), dict(credited))))

    def _copy(self):
        self.copies += 1
        return [torch.zeros(3)]


def test_a_meeting_that_forms_averages_and_credits_the_group():
    r = Round(group_formation="board")
    r.former.meet.return_value = formed()
    result = r.run.run(launch(), HASH)
    assert result.kind is Kind.APPLY and not result.partial
    assert torch.equal(result.average[0], torch.full((3,), 2.0))
    assert result.group == frozenset({A, B}) and result.group_size == 3 and result.from_board
    assert result.samples == 3 * 800 and result.swarm == 10_000
    assert dict(result.contributed) == {p: 2_800 for p in (ME, A, B)}
    r.former.matchmake.assert_not_called()
    args = r.reduction.allreduce.call_args.args
    assert args[4] == 800.0  # weighted by the samples it claims
    assert r.copies == 0  # one state: nothing to average


def test_an_early_meeting_that_does_not_fill_trains_on_without_matchmaking():
    r = Round(group_formation="board")
    r.former.meet.return_value = Formation(reason="peer-b did not come", went=True)
    result = r.run.run(launch(early=True), HASH)
    assert result.kind is Kind.UNFILLED and "peer-b" in result.reason
    r.former.matchmake.assert_not_called()
    r.reduction.allreduce.assert_not_called()


def test_a_meeting_that_fails_falls_back_to_matchmaking():
    r = Round(group_formation="board")
    r.former.meet.return_value = Formation(reason="no group of two on the board")
    r.former.matchmake.return_value = formed(from_board=False)
    result = r.run.run(launch(), HASH)
    assert result.kind is Kind.APPLY and not result.from_board
    r.former.matchmake.assert_called_once()


def test_a_round_whose_meeting_was_held_goes_straight_to_matchmaking():
    r = Round(group_formation="board", met_round=7)
    r.former.matchmake.return_value = formed(from_board=False)
    assert r.run.run(launch(), HASH).kind is Kind.APPLY
    r.former.meet.assert_not_called()


def test_matchmaking_only_never_meets_on_the_board():
    r = Round(group_formation="matchmaking")
    r.former.matchmake.return_value = Formation(reason="no group formed")
    result = r.run.run(launch(), HASH)
    assert result.kind is Kind.FAILED and result.reason == "no group formed"
    r.former.meet.assert_not_called()


def test_a_groupmate_that_planned_another_group_waits_for_a_fresh_read():
    r = Round(group_formation="board")
    r.former.meet.return_value = Formation(reason="the host met elsewhere", disagreed=True, went=True)
    result = r.run.run(launch(), HASH)
    assert result.kind is Kind.FAILED and result.reread
    r.former.matchmake.assert_not_called()


@pytest.mark.parametrize("went, kind", [(True, Kind.UNFILLED), (False, Kind.FAILED)])
def test_board_only_meets_again_at_the_next_step_after_a_meeting_it_went_to(went, kind):
    r = Round(averager=False, group_formation="board_only")
    r.former.meet.return_value = Formation(reason="not everyone came", went=went)
    result = r.run.run(launch(), HASH)
    assert result.kind is kind and not result.reread


def test_a_state_that_differs_from_the_majority_resyncs_from_its_holders():
    r = Round(group_formation="board")
    r.former.meet.return_value = formed({ME: said(), A: said(hash="h-other"), B: said(hash="h-other")})
    result = r.run.run(launch(), HASH)
    assert result.kind is Kind.RESYNC and result.donors == (A, B)
    assert result.samples == 3 * 800  # our samples are in the group's average either way


def test_state_averaging_averages_differing_states_instead_of_resyncing():
    r = Round(group_formation="board", state_averaging=True)
    r.former.meet.return_value = formed({ME: said(), A: said(hash="h-other"), B: said(hash="h-other")})
    r.reduction.average_states.return_value = Reduced([torch.full((3,), 5.0)], True)
    result = r.run.run(launch(), HASH)
    assert result.kind is Kind.APPLY and torch.equal(result.state[0], torch.full((3,), 5.0))
    assert r.copies == 1


def test_a_failed_all_reduce_fails_the_round_and_reports_the_hosts_drops():
    r = Round(group_formation="board")
    hosting = create_autospec(Hosting, instance=True)
    hosting.dropped = {A: "malformed part"}
    hosting.average.side_effect = AllReduceFailed("part 1 did not come")
    r.reduction.hosting.return_value = hosting
    r.former.meet.return_value = formed()
    result = r.run.run(launch(), HASH)
    assert result.kind is Kind.FAILED and "part 1 did not come" in result.reason
    assert r.dropped == [(7, {A: "malformed part"})]
    r.reduction.allreduce.assert_not_called()  # the host reduced at the meeting


def test_a_claim_the_contribution_does_not_show_is_credited_as_shown():
    r = Round(group_formation="board")
    r.former.meet.return_value = formed({ME: said(), A: said(samples=800_000), B: said()})
    r.reduction.allreduce.return_value = Reduced([torch.zeros(3)], True, credits={ME: 800, A: 1_000, B: 800})
    result = r.run.run(launch(), HASH)
    assert result.samples == 800 + 1_000 + 800
    assert r.credits == [(7, {ME: 800, A: 800_000, B: 800}, {ME: 800, A: 1_000, B: 800})]


def test_a_group_of_one_after_admission_fails():
    r = Round(group_formation="board")
    r.former.meet.return_value = formed(group=(ME,))
    result = r.run.run(launch(), HASH)
    assert result.kind is Kind.FAILED and result.reason == "no admitted groupmate"
