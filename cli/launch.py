"""Starting and stopping cotrain processes on this machine: for ``cotrain demo``, tests and benches.

Each process runs in its own process group, so stopping it also stops the DHT and averager processes and the
libp2p daemons it started. Stopping sends SIGTERM (a node leaves cleanly), waits, then kills the group.

``prefix`` runs a process under a wrapper command that ends by exec'ing it, such as ``ip netns exec NAME`` (a Linux
network namespace, for tests and benches of nodes behind NAT): the process keeps the wrapper's pid, so signals and
the group still reach it.

``zygote`` forks a node from a :class:`~cotrain.cli.zygote.Zygote` instead of starting a new Python: many nodes on one
machine then share one copy of torch and hivemind (``cotrain demo``, bench/scale.py).

Nothing is left behind, however the launcher ends: a process started here receives SIGTERM when the launcher dies,
even by SIGKILL (Linux's parent-death signal; a zygote's nodes die with the zygote, which ends with the launcher),
and stops as it does on SIGTERM; :func:`signals_interrupt` turns SIGTERM and SIGHUP into Ctrl-C for a launcher, so
its clean-up runs; :func:`stop_all` stops many processes side by side.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence


class LaunchError(RuntimeError):
    """A process started here failed, or did not get where it should in time. ``logs``: where to look (its log
    files, or the folder that holds them); ``exit_code``: the code it exited with, when that is the failure."""

    def __init__(self, message: str, logs: Sequence[Path | str] = (), exit_code: Optional[int] = None):
        super().__init__(message)
        self.logs = tuple(Path(p) for p in logs)
        self.exit_code = exit_code

    def one_line(self) -> str:
        """The first line of the message and where the logs are (what ``cotrain`` prints for it)."""
        lines = str(self).strip().splitlines()
        first = lines[0].rstrip(":") if lines else type(self).__name__
        return first + (f"; logs: {', '.join(str(p) for p in self.logs)}" if self.logs else "")


def last_words(log: str) -> str:
    """The last line of a process's log that says something, e.g. the one-line error a cotrain command ends with."""
    return next((line.strip() for line in reversed(log.splitlines()) if line.strip()), "")


class Proc:
    def __init__(self, name: str, args: Sequence[str], log_path: Path, env: Optional[dict] = None,
                 prefix: Sequence[str] = (), zygote=None):
        self.name, self.log_path = name, Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        if zygote is not None and not prefix:
            self.popen = zygote.spawn(args, self.log_path, env)
            return
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.popen = subprocess.Popen([*prefix, sys.executable, "-m", "cotrain.cli", *args], stdout=self._log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                                      start_new_session=True, preexec_fn=_terminate_with(os.getpid()))

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.popen.pid, sig)

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        """SIGTERM, wait up to ``timeout``, then SIGKILL the whole group. Returns the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group()
        code = self.popen.wait()
        self._log.close()
        return code

    def kill(self) -> None:
        """kill -9 the process alone (as a crash would), leaving its children to notice."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait()

    def kill_group(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def _terminate_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child receives SIGTERM when ``parent`` (this process, or rather the thread that starts
    it: launchers start processes from their main thread) dies; it exits at once when that already happened."""
    def arm() -> None:
        if not sys.platform.startswith("linux"):
            return
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:
            os._exit(1)

    return arm


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM and SIGHUP interrupt the main thread as Ctrl-C does (KeyboardInterrupt), so that a
    launcher ended by a service manager, a CI job's timeout or a closed terminal runs its clean-up; the previous
    handlers come back after it. Elsewhere than the main thread the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def stop_all(procs: Sequence, timeout: float = 30.0) -> list[Optional[int]]:
    """Stop processes side by side (:class:`Proc`, or anything with ``popen``, ``signal`` and ``stop``): SIGTERM to
    all at once, so they leave together, up to ``timeout`` seconds for all of them, then kill the groups of those
    still there (which also ends what an exited process left behind). -> their exit codes. Ctrl-C, SIGTERM and
    SIGHUP meanwhile cannot cut it short."""
    with uninterrupted():
        for p in procs:
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [p.stop(0.1) for p in procs]  # a second SIGTERM only to one still running after the timeout


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP are held back inside the block: a clean-up that must run to its end (a second Ctrl-C
    must not leave half of what was started running). The first one that came is delivered again after the block,
    to the handler that was there before, so a launcher ended during its clean-up still ends as a signal ends it
    (not with the clean-up's own result); when the block ends with an exception, that exception goes on instead.
    Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum, frame) -> None:
        if not held:
            held.append(signum)

    previous = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    ended_cleanly = False
    try:
        yield
        ended_cleanly = True
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if held and ended_cleanly:
            signal.raise_signal(held[0])


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.2, what: str = "condition",
             procs: Sequence[Proc] = ()):
    """Poll until ``predicate()`` is truthy; fail early if one of ``procs`` died."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for p in procs:
            if not p.alive():
                log = p.log()
                # the first line says what failed, with the process's own last line (its one-line error)
                said = last_words(log).removeprefix("cotrain: ")
                raise LaunchError(f"{p.name} exited with code {p.popen.returncode} while waiting for {what}"
                                  + (f": {said}" if said else "") + f"\n{log[-3000:]}",
                                  logs=[p.log_path], exit_code=p.popen.returncode)
        if time.monotonic() > deadline:
            tails = "".join(f"\n--- the end of {p.name}'s log ({p.log_path}):\n{p.log()[-2000:]}" for p in procs)
            raise LaunchError(f"timed out after {timeout:.0f}s waiting for {what}{tails}",
                              logs=[p.log_path for p in procs])
        time.sleep(interval)


def start_coordinator(state_dir: Path, config: Optional[Path] = None, log_path: Optional[Path] = None,
                      listen: str = "127.0.0.1:0", extra: Sequence[str] = (), timeout: float = 60.0,
                      insecure: bool = True, prefix: Sequence[str] = (), zygote=None) -> tuple[Proc, str]:
    """Start ``cotrain coordinator start`` (plaintext unless ``insecure`` is False and ``extra`` has the TLS
    flags) and wait until it serves; -> (process, HOST:PORT). ``prefix``: see :class:`Proc`.

    The address comes from the coordinator itself (``coordinator.json``, written once it listens), so the default
    port 0 needs no port picked beforehand. A fixed port (a coordinator restarted where its nodes look for it)
    that another socket holds is retried until ``timeout`` while that socket keeps it."""
    state_dir = Path(state_dir)
    info = state_dir / "coordinator.json"
    args = ["coordinator", "start", *(["--insecure"] if insecure else []), "--listen", listen, "--state-dir",
            str(state_dir), *extra]
    if config is not None:
        args += ["--config", str(config)]
    deadline = time.monotonic() + timeout
    while True:
        info.unlink(missing_ok=True)
        proc = Proc("coordinator", args, log_path or state_dir / "coordinator.log", prefix=prefix, zygote=zygote)
        try:
            wait_for(info.exists, max(deadline - time.monotonic(), 1.0), what="the coordinator to listen",
                     procs=[proc])
        except LaunchError:
            proc.stop(5)
            if not prefix and port_in_use(listen) and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise
        except BaseException:  # Ctrl-C while it starts: the caller gets no handle, so nothing else would stop it
            proc.stop(5)
            raise
        return proc, json.loads(info.read_text())["address"]


def port_in_use(listen: str) -> bool:
    """Whether another socket on this machine holds ``HOST:PORT`` (port 0 never is), as a server that sets
    SO_REUSEADDR (gRPC does) would find when it binds."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return False
    host = host.strip("[]") or "0.0.0.0"
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def machine_cpus(allowed: Optional[Sequence[int]] = None, cpu_max: Optional[str] = None) -> int:
    """The CPUs processes started from here may keep busy at once: those in this process's affinity, no more than its
    cgroup's quota allows (``allowed`` and ``cpu_max``, for tests: read from this process when None)."""
    from cotrain.node.limits import read_cpu_max, torch_threads

    allowed = sorted(os.sched_getaffinity(0)) if allowed is None else allowed
    return torch_threads(allowed, read_cpu_max() if cpu_max is None else cpu_max)[0]


def cpu_shares(count: int, allowed: Optional[Sequence[int]] = None, cpu_max: Optional[str] = None,
               pin: bool = True) -> list[list[str]]:
    """``node join`` flags that divide this machine's CPUs among ``count`` nodes started on it, one list per node
    (put them before a node's own flags, which win). Nodes that each take every core (torch's default) fight over
    them instead: of two such nodes on two cores one took 0.2-0.45 steps/s, the other 9.5-12 (bench/cores.py).

    Up to one node per CPU: node i is pinned (``--cpus``) to its own CPUs, a disjoint slice of those allowed, with a
    thread per CPU (fewer under a cgroup quota: the quota's CPUs divided). More nodes than CPUs: one thread each,
    unpinned, so that the kernel balances them (pinned round-robin, two of three nodes would share a core while
    the third had one to itself). One node: no flags, its own default takes every CPU it may use.
    ``pin=False``: the same threads without ``--cpus``. ``allowed`` and ``cpu_max``: as :func:`machine_cpus`."""
    from cotrain.node.limits import format_cpu_list

    if count < 1:
        return []
    allowed = sorted(os.sched_getaffinity(0)) if allowed is None else sorted(allowed)
    budget = machine_cpus(allowed, cpu_max)
    if count == 1:
        return [[]]
    if count > budget:
        return [["--threads", "1"] for _ in range(count)]
    shares = []
    for i in range(count):
        cpus = allowed[i * len(allowed) // count:(i + 1) * len(allowed) // count]
        threads = (i + 1) * budget // count - i * budget // count
        shares.append([*(["--cpus", format_cpu_list(cpus)] if pin else []), "--threads", str(threads)])
    return shares


def start_node(address: str, token: str, name: str, state_dir: Path, log_path: Optional[Path] = None,
               extra: Sequence[str] = (), prefix: Sequence[str] = (), zygote=None) -> Proc:
    """``cotrain node join`` with ``extra`` flags (a node alone on this machine takes all its CPUs; several nodes
    divide them with :func:`cpu_shares`). ``zygote``: fork it from there (see the module's docstring)."""
    args = ["node", "join", address, "--token", token, "--name", name, "--insecure", "--state-dir", str(state_dir),
            *extra]
    return Proc(name, args, log_path or Path(state_dir) / "node.log", prefix=prefix, zygote=zygote)


def start_expert_host(address: str, token: str, name: str, state_dir: Path, experts: int,
                      extra: Sequence[str] = (), zygote=None) -> Proc:
    """``cotrain expert serve`` holding at most ``experts`` experts, listening on loopback (trainers on this machine
    call it)."""
    args = ["expert", "serve", address, "--token", token, "--name", name, "--insecure", "--state-dir",
            str(state_dir), "--experts", str(experts), *extra]
    return Proc(name, args, Path(state_dir) / "host.log", zygote=zygote)
