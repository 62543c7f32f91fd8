"""A volunteer's limits: sizes, the upload cap on a real loopback exchange, idle detection, the node config file."""

import argparse
import time

import pytest

from cotrain.averaging import Admission, Exchange, UploadLimiter, start_dht
from cotrain.node.cli import resolve_options
from cotrain.node.limits import IdleMonitor, parse_size


@pytest.mark.parametrize("text, expected", [("4G", 4 * 2**30), ("512M", 512 * 2**20), ("1.5GiB", int(1.5 * 2**30)),
                                            ("1000", 1000), ("64k", 65536)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_parse_size_names_the_flag():
    with pytest.raises(ValueError, match="--max-memory"):
        parse_size("lots")


def test_token_bucket_delays():
    now = [0.0]
    bucket = UploadLimiter(8e6, burst_s=0.1, clock=lambda: now[0])  # 1 MB/s, 100 KB burst
    assert bucket.delay_for(100_000) == 0.0
    assert bucket.delay_for(500_000) == pytest.approx(0.5)
    now[0] = 10.0  # long idle: the bucket refills only to its burst
    assert bucket.delay_for(100_000) == 0.0
    assert bucket.delay_for(100_000) == pytest.approx(0.1)


def test_only_when_idle_pauses_and_resumes_with_a_fake_load_signal():
    load, now = [0.0], [0.0]
    monitor = IdleMonitor(lambda: load[0], pause_above=0.3, resume_below=0.15, resume_after_s=30.0,
                          clock=lambda: now[0])
    assert not monitor.check().pause
    load[0] = 0.8  # the owner starts using the machine
    assert monitor.check().pause
    now[0], load[0] = 10.0, 0.2  # a little quieter, not idle
    assert monitor.check().pause
    now[0], load[0] = 20.0, 0.05  # idle from now on
    assert monitor.check().pause
    now[0] = 45.0
    assert monitor.check().pause  # 25 s idle: not yet
    now[0] = 51.0
    decision = monitor.check()
    assert not decision.pause and "resuming" in decision.reason


@pytest.mark.swarm
def test_upload_limit_holds_on_loopback(tmp_path):
    a = start_dht(identity_path=str(tmp_path / "a.key"))
    b = start_dht([str(m) for m in a.get_visible_maddrs()], identity_path=str(tmp_path / "b.key"))
    limit_bps = 16e6
    unchecked = Admission("limits", None, enabled=False)  # this test measures the limiter, not admission
    sender = Exchange(a, "limits", unchecked, limiter=UploadLimiter(limit_bps))
    receiver = Exchange(b, "limits", unchecked)
    try:
        payload = b"x" * 4_000_000
        sender.publish("t", "t/blob", payload)
        started = time.monotonic()
        got = receiver.fetch(sender.peer_id, "t/blob", wait_s=5, timeout=60)
        elapsed = time.monotonic() - started
        assert got == payload
        rate = len(payload) * 8 / elapsed
        assert rate <= 1.10 * limit_bps, f"{rate / 1e6:.1f} Mbit/s through a {limit_bps / 1e6:.0f} Mbit/s limit"
    finally:
        sender.shutdown(linger_s=0)
        receiver.shutdown(linger_s=0)
        b.shutdown()
        a.shutdown()


def _args(**kw):
    return argparse.Namespace(**kw)


def test_node_config_file_with_command_line_overrides(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text('coordinator = "c.example:7450"\ntoken = "ct_x"\nmax_cpus = 2\nmax_memory = "4G"\n'
                    'max_upload_mbps = 10\nonly_when_idle = true\nname = "alice"\n')
    o = resolve_options(_args(config=path, name="bob"))
    assert o["coordinator"] == "c.example:7450" and o["token"] == "ct_x" and o["name"] == "bob"
    assert o["max_cpus"] == 2 and o["max_memory"] == 4 * 2**30 and o["max_upload_mbps"] == 10.0
    assert o["only_when_idle"] is True


@pytest.mark.parametrize("text, message", [("colour = 1\n", "unknown key 'colour'"),
                                           ("max_cpus = 'two'\n", "max_cpus must be int"),
                                           ("[node\n", "not valid TOML")])
def test_node_config_file_errors_name_the_key(tmp_path, text, message):
    path = tmp_path / "node.toml"
    path.write_text(text)
    with pytest.raises(SystemExit, match=message):
        resolve_options(_args(config=path, coordinator="c:1", token="t"))
