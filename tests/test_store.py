"""The coordinator's SQLite store: heartbeats written behind in batches, members and units written at once."""

import subprocess
import sys
import time

import pytest

from cotrain.coordinator.store import (CheckpointRow, EvalRow, HistoryRow, NodeRecord, PeerRecord, Store,
                                      TokenExists, UnitRow)
from cotrain.coordinator.workunits import DONE, IN_PROGRESS, Unit
from cotrain.exit_codes import ExitCode


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
    rows = Store(tmp_path).load_units()
    assert rows[1] == UnitRow(epoch=1, index=0, start=0, end=10, state=IN_PROGRESS, holder="b", deadline=9.0, attempts=2)
    assert Unit(**rows[1]._asdict()) == Unit(1, 0, 0, 10, IN_PROGRESS, "b", 9.0, 2)
    store.forget_epochs([0])
    assert [r.epoch for r in store.load_units()] == [1]


def test_rows_come_back_by_name(tmp_path):
    store = Store(tmp_path, history_every_s=0.0)
    store.add_checkpoint(3, "/c/round-3", "ab" * 32, samples_total=96)
    [checkpoint] = store.checkpoints()
    assert isinstance(checkpoint, CheckpointRow)
    assert (checkpoint.round, checkpoint.path, checkpoint.sha256, checkpoint.samples_total) == (3, "/c/round-3",
                                                                                                  "ab" * 32, 96)
    store.add_eval(3, {"val_loss": 1.5, "val_bpc": 2.0, "extra": 0.25})
    [evaluation] = store.evals()
    assert isinstance(evaluation, EvalRow)
    assert (evaluation.round, evaluation.val_loss, evaluation.val_bpc) == (3, 1.5, 2.0)
    assert evaluation.metrics == {"val_loss": 1.5, "val_bpc": 2.0, "extra": 0.25}
    store.save_node(node())
    store.record_heartbeat(node(last_seen=2.0, step=7))
    [row] = store.history()
    assert row == HistoryRow(time=2.0, node_id="a" * 32, metrics={"step": 7})
    store.save_peer("a" * 32, PeerRecord("Qm", b"key", "public"))
    assert store.load_peers() == {"a" * 32: PeerRecord("Qm", b"key", "public")}
    store.create_token("t", expires=5.0, max_nodes=2)
    [token] = store.list_tokens()
    assert (token.name, token.expires, token.revoked, token.max_nodes) == ("t", 5.0, False, 2)
    store.close()


def test_a_token_name_is_taken_once_even_after_revocation(tmp_path):
    store = Store(tmp_path)
    store.create_token("alice")
    store.revoke_token("alice")
    with pytest.raises(TokenExists) as err:
        store.create_token("alice")
    assert err.value.name == "alice"
    assert [t.name for t in store.list_tokens()] == ["alice"]


def test_token_create_twice_ends_with_one_line_and_the_state_exit_code(tmp_path):
    def create():
        return subprocess.run([sys.executable, "-m", "cotrain.cli", "coordinator", "token", "create", "bob",
                               "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)

    first = create()
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("ct_")
    second = create()
    assert second.returncode == ExitCode.STATE
    assert "Traceback" not in second.stderr and not second.stdout  # no second token printed
    [line] = second.stderr.strip().splitlines()
    assert "'bob'" in line


def test_a_failing_flush_warns_once_per_outage_and_keeps_the_rows(tmp_path, caplog):
    import logging
    import sqlite3

    store = Store(tmp_path, flush_every_s=0.01)
    store.save_node(node())
    real_conn, attempts = store._conn, []

    class FullDisk:
        """A connection whose writes fail as on a full disk."""

        def __init__(self, conn):
            self.conn = conn

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.conn.__exit__(*exc)

        def executemany(self, *args):
            attempts.append(1)
            raise sqlite3.OperationalError("database or disk is full")

    caplog.set_level(logging.INFO, logger="cotrain.coordinator.store")
    store._conn = lambda: FullDisk(real_conn())
    store.record_heartbeat(node(last_seen=2.0, step=7))
    deadline = time.monotonic() + 30
    while len(attempts) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(attempts) >= 20
    store._conn = real_conn  # the disk has room again
    other = Store(tmp_path)
    while other.load_nodes()[0].metrics["step"] != 7 and time.monotonic() < deadline:
        time.sleep(0.01)
    store.close()
    assert other.load_nodes()[0].metrics["step"] == 7  # kept through every failed attempt
    warnings = [r for r in caplog.records if r.name == "cotrain.coordinator.store" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1  # one for the outage, not one per attempt


def test_read_evals_reads_a_live_store_without_writing(tmp_path):
    from cotrain.coordinator.store import DB_NAME, read_evals

    assert read_evals(tmp_path) == [] and not (tmp_path / DB_NAME).exists()  # reading creates nothing
    store = Store(tmp_path)
    try:
        store.add_eval(3, {"val_loss": 1.0, "val_bpc": 1.4})
        store.add_eval(5, {"val_loss": 0.9, "val_bpc": 1.3})
        assert [(e.round, e.val_loss) for e in read_evals(tmp_path)] == [(3, 1.0), (5, 0.9)]
        assert read_evals(tmp_path) == store.evals()
    finally:
        store.close()
