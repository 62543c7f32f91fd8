"""RoundStats: written by the round's threads, read by others as a snapshot of their own."""

import threading

from cotrain.averaging.round_stats import FLAGGED_PEERS, HISTORY_ROUNDS, RoundStats


def test_round_stats_are_read_as_a_snapshot_that_later_rounds_do_not_change():
    stats = RoundStats()
    stats.flag("a", "non-finite values")
    stats.applied(0, 3)
    stats.averaged_with(["a", "b"])
    seen = stats.snapshot()
    stats.flag("c", "malformed")
    stats.applied(1, 2)
    stats.averaged_with(["c"])
    stats.rounds_completed += 1
    assert seen.flagged == {"a": "non-finite values"} and seen.history == ((0, 3),) and seen.last_group == ("a", "b")
    assert seen.rounds_completed == 0 and seen.last_group_size == 3

    errors = []

    def write():  # a round's thread, flagging peers and applying rounds as fast as it can
        for i in range(20_000):
            stats.flag(f"peer-{i}", "malformed")
            stats.applied(i, 2)

    writer = threading.Thread(target=write)
    writer.start()
    while writer.is_alive():  # the heartbeat's thread
        try:
            s = stats.snapshot()
            sorted(s.flagged), list(s.history)
        except RuntimeError as e:  # pragma: no cover - what reading the live containers risked
            errors.append(e)
    writer.join()
    assert not errors
    assert len(stats.flagged) == FLAGGED_PEERS and len(stats.history) == HISTORY_ROUNDS  # bounded


def test_a_rounds_result_is_counted_by_its_kind():
    from cotrain.averaging.outcome import Kind, RoundResult

    stats = RoundStats()
    stats.counted(RoundResult(Kind.APPLY, "", group_size=3, group=frozenset({"b", "a"}), from_board=True,
                              hosted=True, meet_s=0.5, allreduce_s=0.25), kept_before=True)
    stats.counted(RoundResult(Kind.APPLY, "", group_size=2, group=frozenset({"c"}), partial=True), kept_before=False)
    stats.counted(RoundResult(Kind.RESYNC, "", from_board=True, partial=True), kept_before=True)
    stats.counted(RoundResult(Kind.FAILED, "", meet_s=1.0), kept_before=True)
    s = stats.snapshot()
    assert (s.rounds_completed, s.groups_from_board, s.groups_matchmade, s.rounds_hosted) == (2, 1, 1, 1)
    assert (s.groups_kept, s.partial_rounds, s.last_group) == (2, 2, ("c",))
    assert (s.meet_s, s.allreduce_s) == (1.5, 0.25)
