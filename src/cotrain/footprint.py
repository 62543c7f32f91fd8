"""What a process and everything it started cost this machine: processes, memory, CPU time, threads, open files and
sockets, read from Linux's ``/proc``.

A node is several processes: the node itself, hivemind's DHT process (and its averager process, when it has one)
and the libp2p daemons they start; a coordinator likewise. Memory is counted twice over:

- ``rss_bytes``: the sum of each process's resident set. Pages the processes share (the forked Python and torch
  images, the daemons' libraries) count once per process, so this overstates what the node adds;
- ``pss_bytes``: the sum of each process's proportional set size: a page shared by k processes counts 1/k in each.
  Summed over the whole machine it is the memory in use, so it is what one node costs (and the figure the node
  reports in its heartbeat and checks against ``--max-memory``).

Elsewhere than Linux (no ``/proc``) every figure is 0: nothing here raises.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

PROC = Path("/proc")
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Footprint:
    processes: int = 0
    rss_bytes: int = 0
    pss_bytes: int = 0
    cpu_s: float = 0.0  # user + system CPU seconds, since each process started
    threads: int = 0
    open_files: int = 0  # file descriptors, sockets included
    sockets: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants, by the kernel's children lists (no scan of every process)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.append(pid)
        try:
            for task in (PROC / str(pid) / "task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue  # gone meanwhile, or a kernel without children lists: its own figures still count
    return out


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after "pid (comm) " (comm may hold spaces). Raises OSError for a process
    gone."""
    stat = (PROC / str(pid) / "stat").read_text()
    return stat[stat.rindex(")") + 2:].split()


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def cpu_seconds(root: int) -> tuple[float, float]:
    """(CPU seconds of process ``root``, of it and its descendants), user and system: the CPU part of
    :func:`footprint` alone, cheap enough to read at every round of a bench. A process gone meanwhile counts 0."""
    own = tree = 0.0
    for pid in process_tree(root):
        try:
            cpu = _cpu_s(_stat(pid))
        except (OSError, ValueError, IndexError):
            continue
        tree += cpu
        own += cpu if pid == root else 0.0
    return own, tree


def _one(pid: int) -> Optional[Footprint]:
    base = PROC / str(pid)
    try:
        fields = _stat(pid)
        cpu_s = _cpu_s(fields)
        threads = int(fields[17])
        rss = int((base / "statm").read_text().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None  # exited while we looked
    pss = rss
    try:
        for line in (base / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass  # no smaps_rollup (old kernel, or another user's process): its RSS stands in
    files = sockets = 0
    try:
        for fd in (base / "fd").iterdir():
            files += 1
            try:
                sockets += os.readlink(fd).startswith("socket:")
            except OSError:
                continue
    except OSError:
        pass
    return Footprint(1, rss, pss, cpu_s, threads, files, sockets)


def footprint(root: Optional[int] = None, descendants: bool = True) -> Footprint:
    """What ``root`` (default: this process) and all its descendants cost now; ``descendants=False``: ``root``
    alone (a node's own process, without its DHT process and libp2p daemon)."""
    if not PROC.is_dir():
        return Footprint()
    pid = root if root is not None else os.getpid()
    parts = [f for f in (_one(p) for p in (process_tree(pid) if descendants else [pid])) if f]
    return Footprint(processes=len(parts), rss_bytes=sum(f.rss_bytes for f in parts),
                     pss_bytes=sum(f.pss_bytes for f in parts), cpu_s=sum(f.cpu_s for f in parts),
                     threads=sum(f.threads for f in parts), open_files=sum(f.open_files for f in parts),
                     sockets=sum(f.sockets for f in parts))
