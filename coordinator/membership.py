"""Membership decisions, as pure functions of (now, state, config) (work units: :mod:`workunits`).

Each returns its decision with a reason in words; the service logs the reason and the health view shows it.
Tests drive them with plain numbers for ``now``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

HEALTHY, STRAGGLER, LOST, LEFT = "healthy", "straggler", "lost", "left"

#: a node slower than this fraction of the median samples/s is a straggler
STRAGGLER_FRACTION = 0.5


@dataclass(frozen=True)
class NodeView:
    node_id: str
    name: str
    joined: float
    last_seen: float
    left: bool
    samples_per_s: float
    loss: float
    step: int = 0
    partial_rounds: int = 0
    rounds_completed: int = 0


def node_state(now: float, node: NodeView, peers: Sequence[NodeView], heartbeat_interval: float,
               lost_after_missed: int) -> tuple[str, str]:
    """healthy / straggler / lost / left, and why."""
    if node.left:
        return LEFT, "left the swarm"
    silent = now - node.last_seen
    limit = heartbeat_interval * lost_after_missed
    if silent > limit:
        return LOST, f"no heartbeat for {silent:.0f}s (limit {limit:.0f}s)"
    if node.loss in (float("inf"), float("-inf")) or (node.loss != node.loss and node.step > 0):
        return STRAGGLER, f"loss is {node.loss}, updates dropped"
    online = [p.samples_per_s for p in peers if not p.left and now - p.last_seen <= limit and p.samples_per_s > 0]
    if len(online) >= 2 and node.samples_per_s > 0:
        median = statistics.median(online)
        if node.samples_per_s < STRAGGLER_FRACTION * median:
            return STRAGGLER, f"{median / node.samples_per_s:.1f}x slower than the median"
    return HEALTHY, "ok"


def swarm_alerts(rows: Sequence[tuple[NodeView, str, str]]) -> list[str]:
    """Alerts in words from (node, state, reason) rows: stragglers, non-finite losses, lost nodes, partial rounds."""
    alerts = []
    for node, state, reason in rows:
        if state == STRAGGLER:
            alerts.append(f"{node.name}: {reason}" + ("" if "loss" in reason else ": straggler"))
        elif state == LOST:
            alerts.append(f"{node.name}: lost ({reason}); its work units were reissued")
        if node.partial_rounds and state in (HEALTHY, STRAGGLER):
            total = node.rounds_completed or node.partial_rounds
            alerts.append(f"{node.name}: {node.partial_rounds} of {total} rounds averaged without every peer's "
                          f"contribution")
    return alerts


def active_nodes(now: float, nodes: Iterable[NodeView], heartbeat_interval: float,
                 lost_after_missed: int) -> list[NodeView]:
    """Nodes that hold data: not left and not lost, in the order they joined."""
    limit = heartbeat_interval * lost_after_missed
    return sorted((n for n in nodes if not n.left and now - n.last_seen <= limit), key=lambda n: (n.joined, n.node_id))


def nodes_to_forget(now: float, nodes: Iterable[NodeView], heartbeat_interval: float, lost_after_missed: int,
                    forget_after: float, since: float) -> list[tuple[str, str]]:
    """Nodes that left, or went silent (lost), more than ``forget_after`` seconds ago, each with why. The coordinator
    drops what it holds for them, so a run of days with churn holds the nodes of its last hour, not every node it
    ever saw. Time away counts from ``since`` (the coordinator's start) at the earliest: after a restart, nodes that
    trained on through the outage have ``forget_after`` to heartbeat again."""
    limit = heartbeat_interval * lost_after_missed
    out = []
    for n in nodes:
        away = now - max(n.last_seen, since)
        if away <= forget_after or not (n.left or now - n.last_seen > limit):
            continue
        out.append((n.node_id, f"node {n.name} ({n.node_id[:8]}) {'left' if n.left else 'went silent'} "
                               f"{away:.0f}s ago (forget_after_s {forget_after:g}): forgotten; it joins anew"))
    return out
