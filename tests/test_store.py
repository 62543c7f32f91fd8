"""The coordinator's SQLite store: heartbeats written behind in batches, members and units written at once."""

import time

from cotrain.coordinator.store import NodeRecord, Store
from cotrain.coordinator.workunits import DONE, IN_PROGRESS, Unit


def node(node_id="a" * 32, last_seen=1.0, left=False, step=0):
    return NodeRecord(node_id, "n", "t", "h", 0.0, last_seen, left, {}, {"step": step})


def test_heartbeats_are_written_behind_and_flushed_on_close(tmp_path):
    store = Store(tmp_path, flush_every_s=3600.0)  # no timed flush in this test
    store.save_node(node())
    store.record_heartbeat(node(last_seen=2.0, step=7))
    other = Store(tmp_path)  # another connection sees only what is committed
    assert other.load_nodes()[0].metrics["step"] == 0
    store.close()  # a clean shutdown writes what is pending
    assert other.load_nodes()[0].metrics["step"] == 7 and other.load_nodes()[0].last_seen == 2.0


def test_timed_flush_and_a_full_write_supersedes_a_pending_heartbeat(tmp_path):
    store = Store(tmp_path, flush_every_s=0.05)
    store.save_node(node())
    store.record_heartbeat(node(last_seen=2.0, step=7))
    other = Store(tmp_path)
    deadline = time.monotonic() + 10
    while other.load_nodes()[0].metrics["step"] != 7 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert other.load_nodes()[0].metrics["step"] == 7
    store.record_heartbeat(node(last_seen=3.0, step=8))
    store.save_node(node(last_seen=4.0, left=True, step=9))  # leaves: written now, in full
    store.close()
    row = other.load_nodes()[0]
    assert row.left and row.metrics["step"] == 9 and row.last_seen == 4.0


def test_units_round_trip_and_finished_epochs_are_forgotten(tmp_path):
    store = Store(tmp_path)
    store.save_units([Unit(0, 0, 0, 10, DONE, "a", 1.0, 1), Unit(1, 0, 0, 10, IN_PROGRESS, "b", 9.0, 2)])
    assert [Unit(*r) for r in Store(tmp_path).load_units()][1] == Unit(1, 0, 0, 10, IN_PROGRESS, "b", 9.0, 2)
    store.forget_epochs([0])
    assert [r[0] for r in store.load_units()] == [1]
