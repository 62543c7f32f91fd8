"""The zygote (cotrain.cli.zygote): nodes forked from one process that loaded torch and hivemind once, as
``cotrain demo`` and bench/scale.py start them. Real processes; each test stops what it started."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cotrain.cli.launch import Proc
from cotrain.cli.zygote import Zygote, ZygoteError
from cotrain.exit_codes import ExitCode

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, and Linux's /proc"),
              pytest.mark.swarm]


def shared_bytes(pid: int) -> int:
    """The pages of ``pid`` that another process maps too (smaps_rollup's Shared_Clean + Shared_Dirty)."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Shared_Clean:", "Shared_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total


def gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # exited; its parent (the zygote, or init) has not reaped it yet
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def zygote(node_zygote):
    """The worker's zygote, which the swarm tests fork from too: these tests must leave it as they found it (the
    tests that close one or write garbage to one start their own)."""
    assert node_zygote.popen.poll() is None, "an earlier test ended the worker's zygote"
    return node_zygote


def test_a_forked_command_runs_as_the_cli_would_and_reports_its_exit_code(zygote, tmp_path):
    version = Proc("version", ["--version"], tmp_path / "version.log", zygote=zygote)
    assert version.popen.wait(30) == 0
    assert "cotrain" in version.log()

    usage = Proc("usage", ["node", "join"], tmp_path / "usage.log", zygote=zygote)  # no coordinator given
    assert usage.popen.wait(30) == ExitCode.USAGE
    assert "HOST:PORT" in usage.log() and "Traceback" not in usage.log()


def test_a_forked_coordinator_serves_shares_the_zygotes_image_and_stops_cleanly(zygote, tmp_path):
    import json

    state = tmp_path / "coordinator"
    state.mkdir()
    proc = Proc("coordinator", ["coordinator", "start", "--insecure", "--listen", "127.0.0.1:0", "--state-dir",
                                str(state)], state / "coordinator.log", zygote=zygote)
    try:
        deadline = time.monotonic() + 60
        while not (state / "coordinator.json").exists():
            assert proc.alive(), proc.log()
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.1)
        assert json.loads((state / "coordinator.json").read_text())["address"].startswith("127.0.0.1:")
        # torch and hivemind as the zygote loaded them: pages it shares with the zygote, not a copy of its own
        assert shared_bytes(proc.pid) > 100 << 20
        assert os.getpgid(proc.pid) == proc.pid  # a session of its own: stopping it stops what it started
    finally:
        code = proc.stop(30)
    assert code == 0, proc.log()


def test_closing_the_zygote_takes_its_nodes_with_it(tmp_path):
    z = Zygote(tmp_path / "zygote.log")
    try:
        # a node whose coordinator never answers: it retries for as long as it lives
        proc = Proc("node", ["node", "join", "127.0.0.1:9", "--token", "t", "--insecure"], tmp_path / "node.log",
                    zygote=z)
        assert proc.alive()
    finally:
        z.close()
    assert gone(proc.pid)
    assert proc.popen.poll() is not None
    with pytest.raises(ZygoteError):
        z.spawn(["--version"], tmp_path / "late.log")


def test_a_malformed_request_is_refused_and_the_zygote_goes_on(tmp_path):
    # a zygote of its own: the refusal of request 99 waits in its pipe for whoever asks as request 99 next
    zygote = Zygote(tmp_path / "zygote.log")
    try:
        zygote.popen.stdin.write(b'not json\n{"id": 99, "args": "node join", "log": "/tmp/x"}\n[1, 2]\n')
        zygote.popen.stdin.flush()
        proc = Proc("version", ["--version"], tmp_path / "version.log", zygote=zygote)
        assert proc.popen.wait(30) == 0
    finally:
        zygote.close()


def test_a_prefixed_process_is_not_forked_from_the_zygote(zygote, tmp_path):
    # a wrapper command (ip netns exec NAME) needs a process of its own to exec: the zygote cannot fork into it
    proc = Proc("env", ["--version"], tmp_path / "env.log", prefix=["env"], zygote=zygote)
    assert proc.popen.wait(30) == 0
    assert isinstance(proc.popen, subprocess.Popen)
