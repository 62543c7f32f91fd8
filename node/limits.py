"""A volunteer's own limits: CPUs, memory, upload bandwidth, and training only while the machine is idle.

Each limit is enforced, not advisory: ``--max-cpus`` pins the process and its threads to that many CPUs,
``--max-upload-mbps`` throttles every byte the node serves to its peers (:class:`cotrain.averaging.UploadLimiter`,
a token bucket in the exchange),
``--max-memory`` makes the node leave cleanly when its resident memory passes the limit, and ``--only-when-idle``
pauses training while other programs keep the machine busy.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Optional

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str, flag: str = "--max-memory") -> int:
    """'4G', '512M', '1.5GiB', '1000000' -> bytes (powers of 1024 for K, M, G, T)."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"{flag}: expected a size like 4G or 512M, got {text!r}")
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * 1024 ** " kmgt".index(unit or " "))


def pin_cpus(count: int) -> list[int]:
    """Restrict this process (and the threads and children it starts) to ``count`` of the CPUs it may use."""
    allowed = sorted(os.sched_getaffinity(0))
    if count < 1:
        raise ValueError(f"--max-cpus: must be >= 1, got {count}")
    chosen = allowed[:count]
    os.sched_setaffinity(0, chosen)
    return chosen


def resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


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
