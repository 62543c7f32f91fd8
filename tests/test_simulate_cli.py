"""`cotrain simulate` as a user types it: three managed nodes at a fractional share of this machine's CPUs (a local
Ray instance of whole CPUs) join and train; a failure of what simulate or demo started ends in one line that says
what failed and where the logs are, with a non-zero exit code and no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cotrain.cli.launch import LaunchError, machine_cpus
from cotrain.cli.main import launch_exit_code, main
from cotrain.exit_codes import ExitCode

from tiny_swarm import tiny_config

#: the installed entry point, as a user runs it
COTRAIN = str(Path(sys.executable).with_name("cotrain"))


def test_launch_error_is_one_line_with_its_logs():
    e = LaunchError("coordinator exited with code 3 while waiting for the coordinator to listen: --x 1: bad\n"
                    "the log's tail\nmore", logs=[Path("/w/coordinator.log")], exit_code=3)
    assert e.one_line() == ("coordinator exited with code 3 while waiting for the coordinator to listen: --x 1: "
                            "bad; logs: /w/coordinator.log")
    assert launch_exit_code(e) == 3
    assert LaunchError("node-1 exited early (code 1); see /w/node.log").one_line() == \
        "node-1 exited early (code 1); see /w/node.log"
    assert launch_exit_code(LaunchError("timed out")) == ExitCode.ERROR
    assert launch_exit_code(LaunchError("killed", exit_code=-9)) == ExitCode.ERROR
    assert launch_exit_code(LaunchError("ended too early", exit_code=0)) == ExitCode.ERROR


def test_demo_launch_error_is_one_line_not_a_traceback(monkeypatch, capsys, tmp_path):
    """cli/main.py handles a LaunchError of any command centrally; cotrain demo's included."""
    import cotrain.cli.demo

    def fails(args):
        raise LaunchError("coordinator exited with code 8 while waiting for the coordinator to listen: Ray said no\n"
                          "a long log tail", logs=[tmp_path / "coordinator.log"], exit_code=8)

    monkeypatch.setattr(cotrain.cli.demo, "run_demo", fails)
    assert main(["demo", "--workdir", str(tmp_path)]) == 8
    err = capsys.readouterr().err
    assert err == (f"cotrain: coordinator exited with code 8 while waiting for the coordinator to listen: Ray said "
                   f"no; logs: {tmp_path / 'coordinator.log'}\n")


def test_simulate_with_a_share_larger_than_the_machine_fails_in_one_line(tmp_path):
    too_many = (os.cpu_count() or 1) + 1
    out = subprocess.run([COTRAIN, "simulate", "--nodes", "2", "--cpus-per-node", str(too_many), "--duration", "5",
                          "--workdir", str(tmp_path / "sim")], capture_output=True, text=True, timeout=180)
    assert out.returncode == ExitCode.CONFIG, out.stderr[-3000:]  # the coordinator's refusal of the flag
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("cotrain: coordinator exited with code 3") and f"--managed-node-cpus {too_many}" in line
    assert f"logs: {tmp_path / 'sim' / 'coordinator' / 'coordinator.log'}" in line, line


def _children() -> dict[int, list[int]]:
    """ppid -> pids, of every process on this machine (Linux /proc)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            out.setdefault(int(stat.rpartition(")")[2].split()[1]), []).append(int(entry))
    return out


def _start_time(pid: int) -> str | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]  # a zombie has ended; its parent reaps it


def _descendants(pid: int) -> set[tuple[int, str]]:
    """(pid, start time) of every process under ``pid`` now."""
    children, found, todo = _children(), set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            started = _start_time(child)
            if started is not None:
                found.add((child, started))
                todo.append(child)
    return found


def _alive(seen: set[tuple[int, str]]) -> set[tuple[int, str]]:
    return {(pid, started) for pid, started in seen if _start_time(pid) == started}


@pytest.mark.swarm
def cpu_limit_available() -> bool:
    """Whether this machine lets a process give itself a cgroup CPU quota (node join --cpu-limit): root, or a
    delegated cgroup. Tried in a process of its own, which it moves."""
    probe = "from cotrain.node.limits import CpuTimeLimit; CpuTimeLimit(1.0).__enter__().__exit__(None, None, None)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60).returncode == 0


def test_simulate_three_nodes_at_a_fractional_share(tmp_path, corpus_file):
    """3 nodes on this machine's CPUs (0.6666 each of 2: shares that do not add up to whole CPUs) join, the swarm
    completes a round, the command exits 0, and every process it started has ended. Where cgroups allow it, the
    nodes' CPUs are enforced (--cpu-limit: a node that could not apply its quota would exit, and the swarm would not
    train)."""
    (tmp_path / "run.toml").write_text(tiny_config(corpus_file).to_toml())
    limit = ["--cpu-limit"] if cpu_limit_available() else []
    proc = subprocess.Popen([COTRAIN, "simulate", "--nodes", "3", "--config", str(tmp_path / "run.toml"), "--rounds",
                             "1", "--duration", "240", "--format", "json", "--workdir", str(tmp_path / "sim"), *limit],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: set[tuple[int, str]] = set()  # everything it started (Ray's processes, the coordinator, the nodes)
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            seen |= _descendants(proc.pid)
            time.sleep(0.5)
    finally:
        if proc.poll() is None:  # too slow: Ctrl-C, as a user would, and it stops what it started
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        stdout, stderr = proc.communicate()
        left = _alive(seen)
        wait_until = time.monotonic() + 30  # Ray's processes end a moment after their driver stops them
        while left and time.monotonic() < wait_until:
            time.sleep(0.5)
            left = _alive(left)
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 0, stderr[-4000:]
    summary = json.loads(stdout)
    # it ended when the swarm reached --rounds, not at the end of --duration
    assert summary["nodes"] == 3 and summary["stopped_by"] == "rounds" and summary["global_round"] >= 1, summary
    assert summary["samples_total"] > 0, summary
    assert sorted(n["node_name"] for n in summary["nodes_detail"]) == ["managed-0", "managed-1", "managed-2"]
    assert summary["cpus_per_node"] * 3 <= machine_cpus()
    assert summary["coordinator_exit_code"] == 0
    assert not left, f"processes simulate started and left running: {sorted(pid for pid, _ in left)}"
