"""Whether a fleet of nodes fits this machine's memory, decided before anything starts.

``cotrain simulate``, ``cotrain demo`` and ``coordinator start --managed-nodes`` start many node processes at once.
Each is torch, hivemind's DHT process and a libp2p daemon, plus the run's model several times over; too many of them
push the machine into swap or the kernel's OOM killer minutes later, after everything has started. So the launchers
estimate the fleet's memory from the run's model (:func:`fleet_bytes`) and refuse, in one line that names the flag,
the estimate, what is available and the largest fleet that fits (:func:`fleet_refusal`), unless told ``--force``.

The figures are measured, not guessed: ``bench/footprint.py`` runs nodes of two model widths and fits a node's
memory (PSS, its processes together) as a base plus a part per parameter; its output is kept in
docs/results/footprint.json, and tests/test_sizing.py fails when the constants below drift more than 25% from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

#: a node's memory beyond its model: the node's Python with torch and hivemind, its DHT process and its libp2p daemon
#: (proportional set size, all three): 575 MB on 2 CPUs, x86_64 (bench/footprint.py, docs/results/footprint.json)
NODE_BASE_BYTES = 575 * 2**20
#: a node's memory per model parameter: the model, its gradients, AdamW's two moments, DiLoCo's global copy and
#: outer momentum, the round's contribution and the average it receives, as float32, and the allocator's slack
BYTES_PER_PARAM = 45.0
#: the coordinator (its gRPC service, DHT process, checkpointer and evaluator), and per model parameter (the
#: checkpoints it takes and evaluates)
COORDINATOR_BASE_BYTES = 423 * 2**20
COORDINATOR_BYTES_PER_PARAM = 41.0


class FleetTooLarge(ValueError):
    """A fleet estimated not to fit this machine's memory; its text is the one-line refusal."""


def check_fleet(flag: str, nodes: int, cfg, force: bool = False, coordinator: bool = True,
                available: Optional[int] = None) -> None:
    """Raise :class:`FleetTooLarge` when ``nodes`` nodes of run config ``cfg`` (and their coordinator) do not fit
    the memory available here, unless ``force``. Skipped where the available memory cannot be read."""
    if force or nodes <= 0:
        return
    available = available_bytes() if available is None else available
    if available <= 0:
        return
    from cotrain.models import build_model, count_parameters

    refusal = fleet_refusal(flag, nodes, count_parameters(build_model(cfg)), available, coordinator)
    if refusal:
        raise FleetTooLarge(refusal)


def node_bytes(params: int) -> int:
    """The memory one node of a model of ``params`` parameters takes."""
    return int(NODE_BASE_BYTES + BYTES_PER_PARAM * params)


def coordinator_bytes(params: int) -> int:
    """The memory the coordinator of a run with a model of ``params`` parameters takes."""
    return int(COORDINATOR_BASE_BYTES + COORDINATOR_BYTES_PER_PARAM * params)


def fleet_bytes(nodes: int, params: int, coordinator: bool = True) -> int:
    """``nodes`` nodes of a ``params``-parameter model, and the coordinator that runs them when ``coordinator``."""
    return nodes * node_bytes(params) + (coordinator_bytes(params) if coordinator else 0)


def fleet_refusal(flag: str, nodes: int, params: int, available: int, coordinator: bool = True) -> Optional[str]:
    """Why ``nodes`` nodes cannot run in ``available`` bytes of memory, naming ``flag`` (the option that asked for
    them), the estimate, what is available and the most nodes that fit; None when they fit."""
    need = fleet_bytes(nodes, params, coordinator)
    if need <= available:
        return None
    each, own = node_bytes(params), coordinator_bytes(params) if coordinator else 0
    fits = max(0, (available - own) // max(1, each))
    return (f"{flag} {nodes}: the nodes need about {_gb(need)} of memory ({_mb(each)} a node for a model of "
            f"{params:,} parameters" + (f", {_mb(own)} the coordinator" if coordinator else "")
            + f"), more than the {_gb(available)} available; at most {fits} fit (pass --force to start anyway)")


def available_bytes(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The memory this process's fleet may take: the kernel's MemAvailable, or less where a cgroup (v2) limits this
    process's group (a container). 0 where it cannot be read (not Linux): the caller skips the check."""
    available = 0
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    try:
        group = (proc / "self" / "cgroup").read_text().strip().split("::", 1)[1]
        folder = cgroup / group.lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit != "max":
            used = int((folder / "memory.current").read_text().strip())
            available = min(available, max(0, int(limit) - used))
    except (OSError, ValueError, IndexError):
        pass
    return available


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB"


def _gb(n: float) -> str:
    return f"{n / 2**30:,.1f} GB"
