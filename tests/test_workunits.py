"""Table-driven tests of the work-unit decisions (pure functions of now, units and rules), with a fake clock."""

import pytest

from cotrain.coordinator.workunits import (DONE, IN_PROGRESS, PENDING, SchedulingRules, Unit, complete_unit,
                                           current_epoch, finished_epochs, issue_unit, open_epoch, plan_ranges,
                                           reclaim_units, unit_counts)

RULES = SchedulingRules(deadline_s=100.0)
RANGES = [(0, 100), (100, 200), (200, 300)]


def book(*units):
    return {u.key: u for u in units}


def apply(units, changed):
    out = dict(units)
    out.update({u.key: u for u in changed})
    return out


@pytest.mark.parametrize("start, end, unit, minimum, expected", [
    (0, 1000, 250, 10, 4),  # about unit_bytes each
    (0, 1000, 300, 10, 4),  # the remainder becomes its own share
    (0, 1000, 5000, 10, 1),  # less data than one unit
    (0, 1000, 250, 400, 2),  # never smaller than a batch needs
    (0, 1000, 1, 1, 7),  # capped by max_units
    (10, 10, 250, 10, 0),  # no data, no units
])
def test_plan_ranges_cover_the_split(start, end, unit, minimum, expected):
    ranges = plan_ranges(start, end, unit, minimum, max_units=7)
    assert len(ranges) == expected
    if ranges:
        assert ranges[0][0] == start and ranges[-1][1] == end
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert all(e - s >= min(minimum, end - start) for s, e in ranges)


def test_units_go_out_lowest_first_and_an_epoch_trains_each_once():
    units, seen = {}, []
    for node in ("a", "b", "c"):
        changed, unit, reason = issue_unit(0.0, units, RANGES, node, RULES)
        units = apply(units, changed)
        seen.append(unit.key)
        assert unit.state == IN_PROGRESS and unit.holder == node and unit.deadline == 100.0, reason
    assert seen == [(0, 0), (0, 1), (0, 2)]
    for node, key in zip("abc", seen):
        done, accepted, reason = complete_unit(5.0, units, node, key)
        assert accepted, reason
        units = apply(units, [done])
    assert unit_counts(units, 0) == dict(total=3, pending=0, in_progress=0, done=3)
    assert current_epoch(units) == 1
    _, unit, _ = issue_unit(6.0, units, RANGES, "a", RULES)
    assert unit.key == (1, 0)


def test_asking_again_returns_the_unit_held():
    changed, first, _ = issue_unit(0.0, {}, RANGES, "a", RULES)
    units = apply({}, changed)
    changed, again, reason = issue_unit(1.0, units, RANGES, "a", RULES)
    assert again == first and not changed and "still" in reason


def test_when_the_epoch_is_all_taken_the_next_opens_early_and_no_further():
    units = book(*open_epoch(0, RANGES[:1]))
    changed, unit, _ = issue_unit(0.0, units, RANGES[:1], "a", RULES)
    units = apply(units, changed)
    changed, unit, reason = issue_unit(0.0, units, RANGES[:1], "b", RULES)
    units = apply(units, changed)
    assert unit.key == (1, 0), reason
    changed, unit, reason = issue_unit(0.0, units, RANGES[:1], "c", RULES)
    assert unit is None and "no unit free" in reason and not changed


@pytest.mark.parametrize("now, active, expected, why", [
    (50.0, {"a"}, [], ""),  # holder alive, before the deadline
    (50.0, set(), [(0, 0)], "is gone"),  # holder lost or left
    (100.0, {"a"}, [(0, 0)], "deadline"),  # holder alive but past the deadline
])
def test_reclaim(now, active, expected, why):
    units = book(Unit(0, 0, 0, 100, IN_PROGRESS, "a", 100.0, 1), Unit(0, 1, 100, 200, DONE, "b", 10.0, 1),
                 Unit(0, 2, 200, 300, PENDING))
    out = reclaim_units(now, units, active)
    assert [u.key for u, _ in out] == expected
    for unit, reason in out:
        assert unit.state == PENDING and unit.holder == "" and why in reason


def test_a_reclaimed_unit_is_reissued_and_finished_by_another_node():
    units = book(Unit(0, 0, 0, 100, IN_PROGRESS, "dead", 100.0, 1), Unit(0, 1, 100, 200, DONE, "b", 10.0, 1))
    units = apply(units, [u for u, _ in reclaim_units(20.0, units, {"b"})])
    changed, unit, reason = issue_unit(21.0, units, RANGES[:2], "b", RULES)
    assert unit.key == (0, 0) and unit.attempts == 2 and "attempt 2" in reason
    units = apply(units, changed)
    done, accepted, _ = complete_unit(30.0, units, "b", (0, 0))
    units = apply(units, [done])
    assert accepted and unit_counts(units, 0)["done"] == 2
    # the dead node comes back and reports the unit it once held: counted once
    _, accepted, reason = complete_unit(31.0, units, "dead", (0, 0))
    assert not accepted and "already done by node b" in reason


@pytest.mark.parametrize("units, node, key, accepted, words", [
    ({}, "a", (0, 0), False, "no such unit"),
    (book(Unit(0, 0, 0, 1, IN_PROGRESS, "a", 9.0, 1)), "a", (0, 0), True, "done"),
    (book(Unit(0, 0, 0, 1, IN_PROGRESS, "b", 9.0, 2)), "a", (0, 0), True, "after it was reissued"),
    (book(Unit(0, 0, 0, 1, PENDING, "", 0.0, 1)), "a", (0, 0), True, "after it was reissued"),
    (book(Unit(0, 0, 0, 1, DONE, "a", 9.0, 1)), "a", (0, 0), False, "already done by this node"),
])
def test_complete(units, node, key, accepted, words):
    done, ok, reason = complete_unit(1.0, units, node, key)
    assert ok == accepted and words in reason
    assert (done is not None) == accepted


def test_finished_epochs_keep_the_newest_so_the_epoch_count_holds():
    units = book(*(Unit(e, 0, 0, 1, DONE, "a", 1.0, 1) for e in range(3)))
    assert finished_epochs(units) == [0, 1]
    kept = {k: u for k, u in units.items() if k[0] == 2}
    assert current_epoch(kept) == current_epoch(units) == 3


def test_unit_seeds_are_stable_and_distinct():
    a, b = Unit(0, 0, 0, 1), Unit(0, 1, 1, 2)
    assert a.seed(7) == Unit(0, 0, 5, 9).seed(7)
    assert len({a.seed(7), b.seed(7), a.seed(8), Unit(1, 0, 0, 1).seed(7)}) == 4


def test_the_health_view_only_reads_and_the_tick_reclaims_a_lost_nodes_unit(tmp_path):
    """The service as the server drives it, with a fake clock: GetSwarmHealth changes nothing; the server's
    periodic tick (CoordinatorService.reclaim, every second) hands a lost node's unit back."""
    from cotrain.coordinator.admission import Issuer, load_or_create_key
    from cotrain.coordinator.reachability import Prober
    from cotrain.coordinator.service import CoordinatorService, RunInfo, SwarmSummary
    from cotrain.coordinator.store import NodeRecord, Store

    now = [1000.0]
    store = Store(tmp_path)
    gone = "a" * 32
    store.save_node(NodeRecord(gone, "gone", "t", "h", joined=0.0, last_seen=900.0))  # silent for 100 s
    store.save_units([Unit(0, 0, 0, 100, IN_PROGRESS, gone, deadline=5000.0, attempts=1)])
    issuer = Issuer(load_or_create_key(tmp_path), "run", 600.0, store.get_meta, store.set_meta, lambda: now[0])
    run = RunInfo("run", "", None, heartbeat_interval=1.0, lost_after_missed=5, initial_peers=list,
                  unit_ranges=RANGES, unit_deadline_s=100.0)
    service = CoordinatorService(store, run, SwarmSummary(), issuer, Prober(), clock=lambda: now[0])
    try:
        for _ in range(2):
            health = service.health()
            assert {n.node_name: n.state for n in health.nodes} == {"gone": "lost"}
            assert list(health.nodes[0].units) == ["0/0"]
            assert health.totals.units_in_progress == 1 and health.totals.units_reissued == 0
        assert [u.state for u in store.load_units()] == [IN_PROGRESS]

        service.reclaim()
        assert [(u.state, u.holder) for u in store.load_units()] == [(PENDING, "")]
        totals = service.health().totals
        assert totals.units_in_progress == 0 and totals.units_reissued == 1 and "0/0" in totals.scheduling_reason
    finally:
        store.close()


class FlakyClient:
    """A coordinator client whose coordinator can be switched off (unit test of the node's work queue)."""

    def __init__(self):
        self.up, self.reported, self.calls = True, [], 0

    def get_work(self, give_up_after, stop=None):
        from cotrain.client import CoordinatorUnavailable
        from cotrain.v1 import coordinator_pb2 as pb

        self.calls += 1
        if not self.up:
            raise CoordinatorUnavailable("down")
        return pb.GetWorkResponse(unit=pb.WorkUnit(epoch=0, index=self.calls), reason="ok")

    def report_work(self, epoch, index, samples, give_up_after, stop=None):
        from cotrain.client import CoordinatorUnavailable
        from cotrain.v1 import coordinator_pb2 as pb

        self.calls += 1
        if not self.up:
            raise CoordinatorUnavailable("down")
        self.reported.append((epoch, index, samples))
        return pb.ReportWorkResponse(accepted=True, reason="done")


def test_work_queue_keeps_reports_while_the_coordinator_is_away_and_does_not_keep_asking():
    import threading

    from cotrain.node.work import WorkQueue

    client = FlakyClient()
    queue = WorkQueue(client, threading.Event())
    unit = queue.next_unit()
    assert unit is not None
    client.up = False
    queue.report(unit, 64)
    assert queue.next_unit() is None and queue.unsent and queue.units_done == 0
    calls = client.calls
    assert queue.next_unit() is None and client.calls == calls  # away: not asked again right away
    client.up = True
    queue._last_try -= queue.retry_away_s  # time passes
    assert queue.next_unit() is not None
    assert client.reported == [(0, unit.index, 64)] and queue.units_done == 1 and not queue.unsent


def test_work_queue_says_when_it_has_to_wait_for_a_unit():
    """The node shows itself paused on the board only while it waits: a unit granted at once calls nothing."""
    import threading

    from cotrain.node.work import WorkQueue
    from cotrain.v1 import coordinator_pb2 as pb

    client = FlakyClient()
    queue = WorkQueue(client, threading.Event())
    waits = []
    assert queue.next_unit(on_wait=lambda: waits.append(1)) is not None and waits == []

    answers = iter([pb.GetWorkResponse(reason="no unit free", retry_after_s=0.01),
                    pb.GetWorkResponse(unit=pb.WorkUnit(epoch=0, index=7), reason="ok")])
    client.get_work = lambda give_up_after, stop=None: next(answers)
    assert queue.next_unit(on_wait=lambda: waits.append(1)).index == 7 and waits == [1]
