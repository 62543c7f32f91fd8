"""Launchers leave nothing behind: ``cotrain demo`` and ``cotrain simulate`` ended by SIGTERM stop every process they
started, and when the launcher itself is killed (SIGKILL) its processes notice and stop. Processes are told apart by
pid (the launcher's process tree, watched while it runs), never by name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cotrain.checkpoint import load_checkpoint
from cotrain.exit_codes import ExitCode
from cotrain.footprint import process_tree

from tiny_swarm import tiny_config

pytestmark = pytest.mark.swarm

COTRAIN = str(Path(sys.executable).with_name("cotrain"))


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that only waits for its parent to read its exit is gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class Watched:
    """A launcher started as a user would (its own session, as a shell's job), and every process it started, as
    seen by walking its process tree while it runs."""

    def __init__(self, args: list[str], log: Path):
        self.log_path = log
        self.popen = subprocess.Popen([COTRAIN, *args], stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        self.seen: set[int] = set()

    def look(self) -> set[int]:
        self.seen |= set(process_tree(self.popen.pid)) - {self.popen.pid}
        return self.seen

    def wait_until(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            self.look()
            assert self.popen.poll() is None, f"the launcher exited before {what}:\n{self.log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.log_path.read_text()[-3000:]}"
            time.sleep(0.2)
        self.look()

    def left_after(self, timeout: float) -> set[int]:
        """The processes it started that still run ``timeout`` seconds on (or fewer, once none does)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is None:
                self.look()
            if not any(alive(p) for p in self.seen):
                return set()
            time.sleep(0.2)
        return {p for p in self.seen if alive(p)}

    def cleanup(self) -> None:
        """What a failed test leaves is killed, by pid."""
        for pid in [self.popen.pid, *self.seen]:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.popen.wait(10)


def demo(tmp_path: Path, corpus: Path, duration: float = 120) -> tuple[Watched, Path]:
    config = tmp_path / "run.toml"
    config.write_text(tiny_config(corpus).to_toml())
    work = tmp_path / "demo"
    return Watched(["demo", "--nodes", "2", "--duration", f"{duration:g}", "--config", str(config), "--workdir",
                    str(work)], tmp_path / "demo.log"), work


def nodes_training(work: Path) -> bool:
    return all((work / f"node-{i}" / "status.json").exists() for i in (1, 2))


@pytest.mark.parametrize("moment", ["starting", "training", "stopping"])
def test_demo_ended_by_sigterm_stops_everything_it_started(tmp_path, corpus_file, moment):
    launcher, work = demo(tmp_path, corpus_file, duration=4 if moment == "stopping" else 120)
    try:
        if moment == "starting":  # the coordinator is up, the nodes are being started
            launcher.wait_until(lambda: (work / "coordinator" / "coordinator.json").exists(), 120,
                                "the coordinator to listen")
        elif moment == "training":
            launcher.wait_until(lambda: nodes_training(work), 180, "both nodes to train")
        else:  # its training time is up: it waits for the final checkpoint, then stops the nodes
            launcher.wait_until(lambda: "training time is up" in launcher.log_path.read_text(), 180,
                                "the demo's training time to end")
        assert launcher.seen, "the launcher started nothing"
        launcher.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30  # everything, the launcher too, within 30 s
        assert launcher.left_after(30) == set(), launcher.log_path.read_text()[-3000:]
        code = launcher.popen.wait(max(1.0, deadline - time.monotonic()))
        # a SIGTERM that comes while the demo stops its processes anyway (they must not be cut short) is over once
        # they are stopped: it ends as it would have, with its result
        assert code == ExitCode.INTERRUPTED or (moment == "stopping" and code == 0), code
        assert "stopped the coordinator" in launcher.log_path.read_text()
        for path in (work / "coordinator").rglob("*.safetensors"):  # none half-written
            load_checkpoint(path)
    finally:
        launcher.cleanup()


def test_the_processes_of_a_demo_killed_with_sigkill_stop_by_themselves(tmp_path, corpus_file):
    launcher, work = demo(tmp_path, corpus_file)
    try:
        launcher.wait_until(lambda: nodes_training(work), 180, "both nodes to train")
        launcher.popen.kill()  # no clean-up of its own: its coordinator, zygote and nodes notice it is gone
        launcher.popen.wait(5)
        assert launcher.left_after(30) == set()
        for path in (work / "coordinator").rglob("*.safetensors"):
            load_checkpoint(path)
    finally:
        launcher.cleanup()


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_simulate_ended_while_its_managed_nodes_start_stops_them_and_ray(tmp_path, ending):
    launcher = Watched(["simulate", "--nodes", "2", "--duration", "120", "--workdir", str(tmp_path / "sim")],
                       tmp_path / "simulate.log")
    try:
        # Ray is up (the coordinator started more processes than its DHT's), its managed nodes on their way
        launcher.wait_until(lambda: len(launcher.seen) >= 6, 180, "Ray to start")
        launcher.popen.send_signal(ending)
        deadline = time.monotonic() + 30
        assert launcher.left_after(30) == set(), launcher.log_path.read_text()[-3000:]
        code = launcher.popen.wait(max(1.0, deadline - time.monotonic()))
        assert code == (ExitCode.INTERRUPTED if ending == signal.SIGTERM else -signal.SIGKILL)
    finally:
        launcher.cleanup()
