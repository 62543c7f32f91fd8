"""STATE_DIR/status.json written off the training loop (cotrain.node.status_file): due() only asks for a write; the
file holds a snapshot taken after the last due(); close() writes the figures the node leaves with."""

import json
import time

from cotrain.node.status_file import StatusFile


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


def test_a_due_write_holds_a_snapshot_taken_after_it(tmp_path):
    figures = {"round": 0}
    taken = []

    def snapshot():
        taken.append(dict(figures))
        return dict(figures)

    status = StatusFile(tmp_path / "status.json", snapshot)
    try:
        assert not (tmp_path / "status.json").exists()  # nothing is written before a write is due
        figures["round"] = 1
        status.due()
        wait_until(lambda: status.writes >= 1)
        assert json.loads((tmp_path / "status.json").read_text()) == {"round": 1}
        for r in range(2, 50):  # due faster than the thread writes: fewer writes, never an older figure
            figures["round"] = r
            status.due()
        wait_until(lambda: taken[-1]["round"] == 49)
    finally:
        figures["round"] = 50
        status.close()
    assert json.loads((tmp_path / "status.json").read_text()) == {"round": 50}  # the figures it leaves with
    assert [t["round"] for t in taken] == sorted(t["round"] for t in taken)
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically, nothing left behind


def test_a_failed_write_is_recorded_not_raised(tmp_path):
    (tmp_path / "a-file").write_text("")
    status = StatusFile(tmp_path / "a-file" / "status.json", lambda: {"round": 1})  # its folder cannot be made
    status.due()
    status.close()  # the thread's write and the last one both fail: logged, the node trains on
    assert status.writes == 0 and status._outage.down


def test_a_snapshot_that_raises_is_recorded_and_the_writer_lives_on(tmp_path):
    figures = iter([ValueError("a bug in the figures"), {"round": 2}, {"round": 3}])

    def snapshot():
        item = next(figures)
        if isinstance(item, Exception):
            raise item
        return item

    status = StatusFile(tmp_path / "status.json", snapshot)
    status.due()
    wait_until(lambda: status._outage.down)
    status.due()  # the thread still writes
    wait_until(lambda: status.writes == 1)
    status.close()
    assert json.loads((tmp_path / "status.json").read_text()) == {"round": 3} and not status._outage.down


def test_writes_due_within_the_least_interval_are_one_write(tmp_path):
    """Rounds come many a second: a write is due at each, the file is written at most every min_interval_s."""
    figures = {"round": 1}
    status = StatusFile(tmp_path / "status.json", lambda: dict(figures), min_interval_s=600.0)
    try:
        status.due()
        wait_until(lambda: status.writes == 1)
        for r in range(2, 20):
            figures["round"] = r
            status.due()
    finally:
        status.close()
    assert status.writes == 2  # the first, and the figures it leaves with: none in between
    assert json.loads((tmp_path / "status.json").read_text()) == {"round": 19}
