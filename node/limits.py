"""A volunteer's own limits: CPUs, memory, upload bandwidth, and training only while the machine is idle.

Each limit is enforced, not advisory: ``--max-cpus`` pins the process and its threads to that many CPUs (``--cpus``
to the CPUs named), and the node runs as many torch threads as the CPUs it may use (:func:`torch_threads`), never
the machine's core count that torch assumes,
``--max-upload-mbps`` throttles every byte the node serves to its peers (:class:`cotrain.averaging.UploadLimiter`,
a token bucket in the exchange),
``--max-memory`` makes the node leave cleanly when its resident memory passes the limit, and ``--only-when-idle``
pauses training while other programs keep the machine busy.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str, flag: str = "--max-memory") -> int:
    """'4G', '512M', '1.5GiB', '1000000' -> bytes (powers of 1024 for K, M, G, T)."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"{flag}: expected a size like 4G or 512M, got {text!r}")
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * 1024 ** " kmgt".index(unit or " "))


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """'0,1', '0-3', '0-3,8' (as taskset -c and /sys/.../cpulist write them) -> the CPU numbers, sorted."""
    cpus: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or (dash and int(high) < int(low)):
            raise ValueError(f"--cpus: expected CPU numbers like 0,1 or 0-3, got {text!r}")
        cpus.update(range(int(low), int(high if dash else low) + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The inverse of :func:`parse_cpu_list`: [0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def choose_cpus(allowed: Iterable[int], cpus: Sequence[int] = (), max_cpus: int = 0) -> list[int]:
    """The CPUs a node runs on, of those its process may use (``allowed``, its affinity): the ones named by ``--cpus``
    (each must be allowed), then the first ``max_cpus`` of them (``--max-cpus``); neither: all allowed."""
    chosen = sorted(set(allowed))
    if cpus:
        outside = sorted(set(cpus) - set(chosen))
        if outside:
            raise ValueError(f"--cpus: CPU {format_cpu_list(outside)} is not among the CPUs this process may use "
                             f"({format_cpu_list(chosen)})")
        chosen = sorted(set(cpus))
    if max_cpus < 0:
        raise ValueError(f"--max-cpus: must be >= 1, got {max_cpus}")
    return chosen[:max_cpus] if max_cpus else chosen


def pin_cpus(count: int = 0, cpus: Sequence[int] = ()) -> list[int]:
    """Restrict this process (and the threads and children it starts) to the CPUs named in ``cpus`` (all it may use
    when empty), then to the first ``count`` of those (0: all of them); -> the CPUs it runs on now."""
    if count < 0 or (count == 0 and not cpus):
        raise ValueError(f"--max-cpus: must be >= 1, got {count}")
    allowed = sorted(os.sched_getaffinity(0))
    chosen = choose_cpus(allowed, cpus, count)
    if chosen != allowed:
        os.sched_setaffinity(0, chosen)
    return chosen


def cpu_quota(cpu_max: Optional[str]) -> Optional[float]:
    """The CPUs a cgroup quota allows, from the text of a cgroup v2 ``cpu.max`` ("200000 100000": 2.0; "max 100000"
    or None: no quota). A text that is neither is no quota either: a limit read wrong must not starve a node."""
    fields = (cpu_max or "").split()
    if len(fields) < 1 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1]) if len(fields) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def own_cgroups(proc_cgroup: Path = Path("/proc/self/cgroup")) -> tuple[Optional[str], Optional[str]]:
    """This process's cgroups as ``/proc/self/cgroup`` names them, without the leading "/": (the one of cgroup v1's
    cpu hierarchy, the cgroup v2 one); None where it has none. Raises OSError when the file cannot be read."""
    own_v1 = own_v2 = None
    for line in proc_cgroup.read_text().splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            own_v2 = path.lstrip("/")
        elif "cpu" in controllers.split(","):
            own_v1 = path.lstrip("/")
    return own_v1, own_v2


def read_cpu_max(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> Optional[str]:
    """This process's cgroup CPU quota as cgroup v2's ``cpu.max`` writes it ("QUOTA PERIOD" or "max PERIOD"), the
    tightest of its own cgroup and the root one seen from here (a container's), or None when there is none. Read
    from cgroup v1's ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` where there is no v2 ``cpu.max``."""
    try:
        own_v1, own_v2 = own_cgroups(proc_cgroup)
    except OSError:
        own_v1 = own_v2 = None
    own_v1, own_v2 = own_v1 or "", own_v2 or ""
    texts = []
    for folder in {root, root / own_v2}:
        try:
            texts.append((folder / "cpu.max").read_text())
        except OSError:
            pass
    if not texts:
        for folder in {root / "cpu", root / "cpu" / own_v1}:
            try:
                quota = (folder / "cpu.cfs_quota_us").read_text().strip()
                period = (folder / "cpu.cfs_period_us").read_text().strip()
            except OSError:
                continue
            texts.append(f"{'max' if quota.startswith('-') else quota} {period}")
    limits = [(cpu_quota(t), t.strip()) for t in texts]
    limits = [(q, t) for q, t in limits if q is not None]
    return min(limits)[1] if limits else None


def torch_threads(allowed: Iterable[int], cpu_max: Optional[str] = None, threads: int = 0,
                  pinned: bool = False) -> tuple[int, str]:
    """How many torch threads a node runs, and why. ``allowed``: the CPUs it may use (its affinity, after ``--cpus``
    and ``--max-cpus``); ``cpu_max``: its cgroup's quota (:func:`read_cpu_max`); ``threads``: ``--threads`` (0:
    choose); ``pinned``: whether ``--cpus`` or ``--max-cpus`` chose the CPUs.

    An explicit ``--threads`` wins, but never more than the CPUs it was pinned to. Otherwise one thread per CPU it
    may use, and no more than a cgroup quota allows (rounded up): torch's own default counts the machine's cores, so
    a node pinned to 2 of 64 cores, or in a container limited to 2 CPUs, would run 64 threads on 2 CPUs."""
    count = len(set(allowed))
    if count < 1:
        raise ValueError("no CPU to run on")
    if threads:
        if pinned and threads > count:
            return count, f"--threads {threads}, at most one per CPU it is pinned to ({count})"
        return threads, f"--threads {threads}"
    quota = cpu_quota(cpu_max)
    cpus = f"{count} CPU{'s' if count > 1 else ''} {'it is pinned to' if pinned else 'it may use'}"
    if quota is not None and math.ceil(quota) < count:
        return max(1, math.ceil(quota)), f"its cgroup's CPU quota: {quota:g} CPUs (of {cpus})"
    return count, f"one per CPU: {cpus}"


def lower_thread_priority(by: int) -> str:
    """Make the calling thread ``by`` nicer than it is (Linux gives every thread its own nice value; threads it
    starts from then on inherit it; raising one's own nice value needs no privilege). -> what was done, in words."""
    if by <= 0 or not hasattr(os, "setpriority"):
        return "training at the node's own priority"
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + by))
    except OSError as e:
        return f"training at the node's own priority (could not lower it: {e})"
    return f"training at nice {min(19, now + by)}, below the node's networking (nice {now})"


@dataclass
class IdleDecision:
    pause: bool
    reason: str


class IdleMonitor:
    """Decides whether to pause training because other programs use the machine.

    ``busy()`` returns the fraction (0..1) of the machine's CPU time used by *other* processes over the last
    interval. Training pauses when it passes ``pause_above`` and resumes when it has stayed below
    ``resume_below`` for ``resume_after_s`` seconds (hysteresis, so a node does not flap).
    """

    def __init__(self, busy: Callable[[], float], pause_above: float = 0.3, resume_below: float = 0.15,
                 resume_after_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.busy, self.clock = busy, clock
        self.pause_above, self.resume_below, self.resume_after_s = pause_above, resume_below, resume_after_s
        self.paused = False
        self.quiet_since: Optional[float] = None

    def check(self) -> IdleDecision:
        load, now = self.busy(), self.clock()
        if not self.paused:
            if load > self.pause_above:
                self.paused, self.quiet_since = True, None
                return IdleDecision(True, f"the machine is in use ({load:.0%} busy with other programs): pausing")
            return IdleDecision(False, "idle")
        if load > self.resume_below:
            self.quiet_since = None
            return IdleDecision(True, f"still in use ({load:.0%} busy)")
        if self.quiet_since is None:
            self.quiet_since = now
        if now - self.quiet_since >= self.resume_after_s:
            self.paused = False
            return IdleDecision(False, f"idle for {self.resume_after_s:.0f}s: resuming")
        return IdleDecision(True, "quiet; waiting to be sure before resuming")


class OtherProcessesLoad:
    """The CPU fraction used by processes other than this one (and its children), from /proc/stat."""

    def __init__(self):
        self.last = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        total, idle = sum(fields[:8]), fields[3] + fields[4]
        times = os.times()
        own = (times.user + times.system + times.children_user + times.children_system) * os.sysconf("SC_CLK_TCK")
        return total, idle, own

    def __call__(self) -> float:
        total, idle, own = self._sample()
        t0, i0, o0 = self.last
        self.last = (total, idle, own)
        elapsed = total - t0
        if elapsed <= 0:
            return 0.0
        busy_others = (elapsed - (idle - i0)) - (own - o0)
        return max(0.0, min(1.0, busy_others / elapsed))


class CpuTimeLimit:
    """``--cpu-limit``: this process and every process it starts (hivemind's DHT process and averager, the libp2p
    daemon) get at most ``cpus`` CPUs of time (0.25: a quarter of one core), enforced by the kernel: a cgroup of
    their own under this process's, with a CFS quota of ``cpus x period_us`` every ``period_us``. Unlike
    ``--max-cpus`` it can be a fraction, and it bounds the node's helpers too.

    Needs a cgroup this process may create folders in: root's, or one systemd delegates (cgroup v2 with the cpu
    controller; cgroup v1's cpu hierarchy as root). Elsewhere it raises ValueError naming the flag and saying what
    to run instead (``systemd-run --user --scope -p CPUQuota=...``, which does the same from outside).

    ``period_us``: 20 ms rather than the kernel's default 100 ms. A node that spent its quota waits for the next
    period, and every message its DHT process or daemon answers meanwhile waits with it: at 0.05 CPUs and 100 ms a
    reply could wait 95 ms, at 20 ms 19 ms. Shorter periods cost the scheduler more; 1 ms is the kernel's least.

    As a context manager: enter moves this process into the new cgroup; exit moves it back and removes the cgroup
    (once the processes it started have ended: a cgroup with a process left in it cannot be removed; it is tried
    again for a few seconds, then left, and the next node's start removes such leftovers)."""

    PREFIX = "cotrain-node-"

    def __init__(self, cpus: float, period_us: int = 20_000, root: Path = Path("/sys/fs/cgroup"),
                 proc_cgroup: Path = Path("/proc/self/cgroup")):
        if not cpus > 0:
            raise ValueError(f"--cpu-limit: must be > 0 CPUs, got {cpus}")
        self.cpus, self.period_us = float(cpus), int(period_us)
        self.quota_us = max(1000, int(round(self.cpus * self.period_us)))  # the kernel's least quota is 1 ms
        self.root, self.proc_cgroup = Path(root), Path(proc_cgroup)
        self.parent: Optional[Path] = None
        self.folder: Optional[Path] = None

    def _parent(self) -> tuple[Path, str]:
        """The cgroup this process is in, as a folder, and its kind: "v1" (a cpu hierarchy of its own) or "v2"."""
        try:
            own_v1, own_v2 = own_cgroups(self.proc_cgroup)
        except OSError as e:
            raise ValueError(f"--cpu-limit: cannot read this process's cgroup ({self.proc_cgroup}: {e})") from None
        if own_v1 is not None and (self.root / "cpu" / own_v1 / "cpu.cfs_quota_us").exists():
            return self.root / "cpu" / own_v1, "v1"
        if own_v2 is not None:
            for base in (self.root, self.root / "unified"):
                if (base / own_v2 / "cgroup.controllers").exists():
                    return base / own_v2, "v2"
        raise ValueError("--cpu-limit: no cgroup CPU controller found under "
                         f"{self.root}; {self.outside_hint()}")

    def outside_hint(self) -> str:
        return (f"run the node under `systemd-run --user --scope -p CPUQuota={self.cpus * 100:g}% cotrain node join "
                "...` instead, without --cpu-limit")

    def __enter__(self) -> "CpuTimeLimit":
        parent, kind = self._parent()
        self._remove_leftovers(parent)
        folder = parent / f"{self.PREFIX}{os.getpid()}"
        try:
            folder.mkdir(exist_ok=True)
        except OSError as e:
            raise ValueError(f"--cpu-limit: cannot create a cgroup in {parent} ({e.strerror}): run as root, or "
                             f"{self.outside_hint()}") from None
        try:
            if kind == "v1":
                (folder / "cpu.cfs_period_us").write_text(str(self.period_us))
                (folder / "cpu.cfs_quota_us").write_text(str(self.quota_us))
            elif (folder / "cpu.max").exists():
                (folder / "cpu.max").write_text(f"{self.quota_us} {self.period_us}")
            else:
                raise ValueError(f"--cpu-limit: the cgroup {parent} does not hand the cpu controller to the cgroups "
                                 f"under it (its cgroup.subtree_control); {self.outside_hint()}")
            (folder / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as e:
            self._remove(folder)
            raise ValueError(f"--cpu-limit: cannot set the quota in {folder} ({e.strerror}); "
                             f"{self.outside_hint()}") from None
        except ValueError:
            self._remove(folder)
            raise
        self.parent, self.folder = parent, folder
        return self

    def __exit__(self, *exc) -> None:
        if self.folder is None:
            return
        try:
            (self.parent / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            return  # still inside: the folder cannot go; the next start removes it once empty
        deadline = time.monotonic() + 5.0  # the DHT process and the daemon end after the node said stop
        while not self._remove(self.folder) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.folder = None

    def describe(self) -> str:
        return (f"CPU time limited to {self.cpus:g} CPUs ({self.quota_us} us every {self.period_us} us, cgroup "
                f"{self.folder})")

    @staticmethod
    def _remove(folder: Path) -> bool:
        try:
            folder.rmdir()  # the kernel refuses while a process is in it
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def _remove_leftovers(self, parent: Path) -> None:
        """Cgroups of earlier nodes that ended without removing theirs (killed): the empty ones of processes that
        no longer run go (a node starting beside this one may have created its folder and not yet entered it)."""
        try:
            leftovers = [p for p in parent.iterdir() if p.name.startswith(self.PREFIX) and p.is_dir()]
        except OSError:
            return
        for folder in leftovers:
            pid = folder.name[len(self.PREFIX):]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                self._remove(folder)
