"""The coordinator's expert hosts (issue 56): who hosts which expert of the run's grid, kept as hosts report.

An expert host reports, every few seconds, what it will hold (its capacity) and what it holds; the pool answers with
what it is to hold (:func:`cotrain.moe.assignment.plan_experts`, over the hosts heard from within ``lost_after_s``).
A host not heard from that long is gone, and its experts go to the others at the next report of any host: within a
minute at the default. Trainers read :meth:`ExpertPool.directory`: each expert's host peer. The clock is injected.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from cotrain.moe.assignment import ExpertPlan, Host, plan_experts

#: seconds without a report after which a host is gone: five of its reports (every 3 s), well under a minute
LOST_AFTER_S = 15.0
#: experts a host may say it holds or will hold at most (its report is hostile: bounded before it is planned)
MAX_CAPACITY = 4096


@dataclass(frozen=True)
class Load:
    """What one expert did on its host: calls answered, its optimizer's steps, and the steps it started from there."""
    uid: str
    forward: int = 0
    backward: int = 0
    updates: int = 0
    started_from: int = 0


@dataclass(frozen=True)
class HostReport:
    node_id: str
    peer_id: str
    capacity: int
    holds: tuple[str, ...]
    at: float
    #: each expert it holds, as it said
    served: tuple[Load, ...] = ()
    refused: int = 0  # calls it refused since it started


class ExpertPool:
    def __init__(self, uids: Sequence[str], lost_after_s: float = LOST_AFTER_S,
                 now: Callable[[], float] = time.monotonic):
        self.uids, self.lost_after_s, self.now = list(uids), lost_after_s, now
        self._lock = threading.Lock()
        self._hosts: dict[str, HostReport] = {}
        self._plan = plan_experts(self.uids, [])

    def report(self, node_id: str, peer_id: str, capacity: int, holds: Sequence[str],
               served: Sequence[Load] = (), refused: int = 0) -> tuple[str, ...]:
        """A host's report (hostile: capacity clamped, holds bounded, the load of experts it does not hold
        dropped) -> the experts it is to hold now."""
        capacity = max(0, min(int(capacity), MAX_CAPACITY))
        known = set(self.uids)
        held = tuple(dict.fromkeys(u for u in list(holds)[:MAX_CAPACITY] if u in known))
        load = {x.uid: Load(x.uid, *(max(0, int(v)) for v in (x.forward, x.backward, x.updates, x.started_from)))
                for x in list(served)[:MAX_CAPACITY] if x.uid in held}
        with self._lock:
            self._hosts[node_id] = HostReport(node_id, peer_id, capacity, held, self.now(), tuple(load.values()),
                                              max(0, int(refused)))
            return self._replan().holds.get(node_id, ())

    def holder(self, uid: str) -> Optional[str]:
        """The node that holds ``uid`` as last planned (None: no host, or not an expert of the run)."""
        with self._lock:
            return self._plan.host_of().get(uid)

    def hosts(self) -> list[HostReport]:
        """The hosts alive now, as last heard (what each holds as last planned), by node id."""
        with self._lock:
            self._replan()
            return sorted(self._hosts.values(), key=lambda h: h.node_id)

    def leave(self, node_id: str) -> None:
        """A host that left (or was revoked): its experts move at once."""
        with self._lock:
            self._hosts.pop(node_id, None)
            self._replan()

    def _replan(self) -> ExpertPlan:
        now = self.now()
        for node, seen in list(self._hosts.items()):
            if now - seen.at > self.lost_after_s:
                del self._hosts[node]
        hosts = [Host(h.node_id, h.capacity, h.holds) for h in self._hosts.values()]
        self._plan = plan_experts(self.uids, hosts)
        # what a host is told it holds is what it holds until its next report says otherwise
        for node, uids in self._plan.holds.items():
            self._hosts[node] = dataclasses.replace(self._hosts[node], holds=uids)
        return self._plan

    def directory(self) -> dict[str, str]:
        """expert -> the peer id of its host, as of the last plan (hosts lost since are dropped now)."""
        with self._lock:
            plan = self._replan()
            return {uid: self._hosts[node].peer_id for uid, node in plan.host_of().items()}

    def status(self) -> tuple[int, int, str]:
        """(hosts, experts hosted, the plan's reason in words)."""
        with self._lock:
            plan = self._replan()
            return len(self._hosts), len(self.uids) - len(plan.unhosted), plan.reason
