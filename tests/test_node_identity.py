"""What a node keeps across runs in its state dir (cotrain.node.identity): its node id and the coordinator's key,
per coordinator address."""

import logging

from cotrain.node.identity import NodeIdentity


def test_the_node_id_is_kept_per_coordinator_and_an_unreadable_file_means_a_first_join(tmp_path):
    a, b = NodeIdentity(tmp_path, "a:1"), NodeIdentity(tmp_path, "b:2")
    assert a.saved_node_id() == ""
    a.save_node_id("1" * 32)
    b.save_node_id("2" * 32)
    assert NodeIdentity(tmp_path, "a:1").saved_node_id() == "1" * 32
    assert NodeIdentity(tmp_path, "b:2").saved_node_id() == "2" * 32
    (tmp_path / "node.json").write_text("{not json")
    assert a.saved_node_id() == ""
    (tmp_path / "node.json").write_text('["a list"]')
    assert a.saved_node_id() == ""
    a.save_node_id("3" * 32)  # a broken file is replaced, not a crash
    assert a.saved_node_id() == "3" * 32


def test_without_a_state_dir_nothing_is_kept():
    identity = NodeIdentity(None, "a:1")
    identity.save_node_id("1" * 32)
    identity.keep_coordinator_key(b"key")
    assert identity.saved_node_id() == ""


def test_a_changed_coordinator_key_is_kept_and_warned_about(tmp_path, caplog):
    identity = NodeIdentity(tmp_path, "a:1")
    with caplog.at_level(logging.WARNING, logger="cotrain.node.identity"):
        identity.keep_coordinator_key(b"first")
        identity.keep_coordinator_key(b"first")
        assert not caplog.records  # the first key, and the same again: nothing to say
        identity.keep_coordinator_key(b"second")
        assert len(caplog.records) == 1
    assert (tmp_path / "coordinator-keys.json").read_text() == '{"a:1": "' + b"second".hex() + '"}'
