"""The swarm's health view (``GetSwarmHealth``, the dashboard, ``cotrain status``), as a pure function of what the
coordinator holds.

It only reads: lost nodes' units go back to the pool on the service's periodic reclaim, not here. Each node's state
comes with its reason in words (:func:`membership.node_state`); the alerts name nodes by the names they joined with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from cotrain.v1 import coordinator_pb2 as pb

from cotrain.coordinator.membership import NodeView, node_state, swarm_alerts
from cotrain.coordinator.node_metrics import metrics_message
from cotrain.coordinator.store import NodeRecord, PeerRecord
from cotrain.coordinator.unit_pool import UnitPool
from cotrain.coordinator.validation import NodeVerdict


@dataclass
class SwarmSummary:
    """What the checkpointer learned, for the health view."""

    val_loss: float = math.nan
    val_bpc: float = math.nan
    val_round: int = 0
    latest_checkpoint: str = ""
    latest_checkpoint_round: int = 0
    val_metrics: dict = field(default_factory=dict)


def swarm_health(now: float, *, run_id: str, heartbeat_interval: float, lost_after_missed: int,
                 summary: SwarmSummary, nodes: Mapping[str, NodeRecord], views: Sequence[NodeView],
                 peers: Mapping[str, PeerRecord], rates: Mapping[str, tuple[float, int, float]],
                 units: UnitPool, verdicts: Optional[Mapping[str, NodeVerdict]] = None,
                 validator_totals: Optional[tuple[float, int]] = None) -> pb.SwarmHealth:
    """The swarm at ``now``. ``views`` are ``nodes``' views, in the same order; ``rates`` is each node's
    (time, bytes_sent, bytes/s) at its last heartbeat; ``verdicts``: the validator's, by node, and
    ``validator_totals`` its (CPU seconds, checks) (verification)."""
    verdicts = verdicts or {}
    checking = validator_totals or (0.0, 0)
    rows, states = [], []
    by_peer = names_by_peer(nodes)
    totals = pb.SwarmTotals(val_loss=summary.val_loss, val_bpc=summary.val_bpc, val_round=summary.val_round,
                            latest_checkpoint=summary.latest_checkpoint,
                            latest_checkpoint_round=summary.latest_checkpoint_round,
                            val_metrics={k: float(v) for k, v in summary.val_metrics.items()},
                            validator_cpu_s=checking[0], checks=checking[1], **units.totals())
    for view, node in zip(views, nodes.values()):
        state, reason = node_state(now, view, views, heartbeat_interval, lost_after_missed)
        states.append((view, state, reason))
        m = metrics_message(node.metrics)
        online = state in ("healthy", "straggler")
        rows.append(pb.NodeHealth(node_id=node.node_id, node_name=node.name, state=state, metrics=m,
                                  last_seen_unix=node.last_seen, joined_unix=node.joined, reason=reason,
                                  bytes_per_s=rates.get(node.node_id, (0, 0, 0.0))[2] if online else 0.0,
                                  units=[u.name for u in units.held_by(node.node_id)],
                                  reachability=peers[node.node_id].reachability if node.node_id in peers else "",
                                  groupmates=[by_peer.get(p, f"peer ...{p[-8:]}") for p in m.last_group]))
        verdict = verdicts.get(node.node_id)
        if verdict is not None:
            rows[-1].verification.CopyFrom(pb.Verification(checks=verdict.checks, failed=verdict.fails,
                                                            reputation=verdict.score, suspended=verdict.suspended,
                                                            reason=verdict.reason, replayed=verdict.replayed))
        if online:
            totals.nodes_online += 1
            totals.samples_per_s += m.samples_per_s
        totals.global_round = max(totals.global_round, m.round)
        totals.samples_total = max(totals.samples_total, m.samples_total)
        totals.bytes_sent += m.bytes_sent
        totals.bytes_received += m.bytes_received
    alerts = swarm_alerts(states) + flag_alerts(nodes) + refusal_alerts(nodes, peers) + [
        f"node {nodes[n].name} was suspended: it failed the checks of its contributions ({v.reason})"
        for n, v in verdicts.items() if v.suspended and n in nodes]
    return pb.SwarmHealth(run_id=run_id, nodes=rows, totals=totals, alerts=alerts, now_unix=now)


def names_by_peer(nodes: Mapping[str, NodeRecord]) -> dict[str, str]:
    """Node names by the peer id each last reported."""
    return {n.metrics.get("peer_id"): n.name for n in nodes.values() if n.metrics.get("peer_id")}


def flag_alerts(nodes: Mapping[str, NodeRecord]) -> list[str]:
    """Nodes whose contributions their peers dropped (non-finite or malformed updates)."""
    by_peer = names_by_peer(nodes)
    flagged: dict[str, int] = {}
    for node in nodes.values():
        for peer in node.metrics.get("flagged_peers", []):
            flagged[peer] = flagged.get(peer, 0) + 1
    return [f"{by_peer.get(peer, 'peer ' + peer[-8:])}: sent non-finite or malformed updates; dropped by "
            f"{count} peer(s)" for peer, count in sorted(flagged.items())]


def refusal_alerts(nodes: Mapping[str, NodeRecord], peers: Mapping[str, PeerRecord]) -> list[str]:
    """Peers that members refused on the data plane (no valid credential: strangers, revoked or expired)."""
    by_peer = {p.peer_id: nodes[n].name for n, p in peers.items() if n in nodes}
    refused: dict[str, int] = {}
    for node in nodes.values():
        if node.left:
            continue
        for peer in node.metrics.get("refused_peers", []):
            refused[peer] = refused.get(peer, 0) + 1
    return [f"{by_peer[peer] + ' (revoked or expired)' if peer in by_peer else 'unknown peer ...' + peer[-8:]}: "
            f"refused on the data plane by {count} member(s)" for peer, count in sorted(refused.items())]
