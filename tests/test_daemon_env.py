"""The libp2p daemons a process starts get cotrain's Go garbage collector target, unless the operator set one."""

import os

from cotrain.averaging.dht import DAEMON_GOGC, go_gc_target


def test_the_daemons_gc_target_is_set_for_the_start_only(monkeypatch):
    monkeypatch.delenv("GOGC", raising=False)
    with go_gc_target():
        assert os.environ["GOGC"] == DAEMON_GOGC
    assert "GOGC" not in os.environ


def test_an_operators_gogc_is_kept(monkeypatch):
    monkeypatch.setenv("GOGC", "200")
    with go_gc_target():
        assert os.environ["GOGC"] == "200"
    assert os.environ["GOGC"] == "200"
