"""The gRPC ``Coordinator`` service: admission, heartbeats, work units, data, health.

Runs on one asyncio loop; the in-memory view of the nodes is mirrored to the SQLite :class:`Store` before any answer
leaves, so a restarted coordinator knows every member it had acknowledged.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import grpc

from cotrain.data import Corpus
from cotrain.protocol import MAX_READ_BYTES, SUPPORTED_PROTOCOL_VERSIONS
from cotrain.v1 import coordinator_pb2 as pb
from cotrain.v1 import coordinator_pb2_grpc as pb_grpc

from cotrain.coordinator.admission import Issuer, needs_renewal, nodes_to_revoke
from cotrain.coordinator.membership import NodeView, active_nodes, node_state, nodes_to_forget, swarm_alerts
from cotrain.coordinator.reachability import InvalidPeer, Prober, parse_peer, reachability_decision
from cotrain.coordinator.workunits import (SchedulingRules, Unit, complete_unit, current_epoch, finished_epochs,
                                           held_by, issue_unit, reclaim_units, unit_counts)
from cotrain.coordinator.ratelimit import RateLimiter, peer_address
from cotrain.coordinator.store import NodeRecord, PeerRecord, Store, hash_secret

logger = logging.getLogger(__name__)

MAX_NAME_LEN = 64
CHECKPOINT_CHUNK = 1 << 20
MAX_TOKEN_LEN = 256
METRIC_FIELDS = ("step", "round", "loss", "samples_per_s", "bytes_sent", "bytes_received", "samples_total", "epoch",
                 "partial_rounds", "rounds_completed", "samples_local", "compute_s", "wall_s", "state_bytes_sent",
                 "state_bytes_received", "peer_id", "units_done", "refused", "groups_from_board", "groups_matchmade",
                 "meet_s", "allreduce_s", "memory_bytes", "processes", "heartbeat_ms", "lr")
#: a member's progress-record key (hivemind's RSA public key, DER) is about 300 bytes
MAX_RECORD_KEY_BYTES = 2048
#: how long a node waits before asking again when no work unit is free
RETRY_WORK_S = 2.0


@dataclass
class RunInfo:
    run_id: str
    config_toml: str
    corpus: Optional[Corpus]  # None for runs whose nodes make their own data (world models)
    heartbeat_interval: float
    lost_after_missed: int
    initial_peers: Callable[[], list[str]]
    join_limit: tuple[float, int] = (0.0, 1)  # (per second, burst) per address; 0: none
    heartbeat_limit: tuple[float, int] = (0.0, 1)
    #: work units of every epoch (cotrain.coordinator.workunits.plan_ranges), their deadline, the run's seed
    unit_ranges: list = field(default_factory=list)
    unit_deadline_s: float = 900.0
    seed: int = 0
    #: seconds after a node left or went silent before the service drops what it holds for it
    forget_after_s: float = 3600.0
    #: how often each byte value occurs in the training text (Corpus.byte_counts); nodes start their output bias
    #: from it
    byte_counts: list = field(default_factory=list)


@dataclass
class SwarmSummary:
    """What the checkpointer learned, for the health view."""

    val_loss: float = math.nan
    val_bpc: float = math.nan
    val_round: int = 0
    latest_checkpoint: str = ""
    latest_checkpoint_round: int = 0
    val_metrics: dict = field(default_factory=dict)


class InvalidField(ValueError):
    pass


def _check_name(name: str) -> str:
    if not name or len(name) > MAX_NAME_LEN or not name.isprintable():
        raise InvalidField(f"node_name: must be 1..{MAX_NAME_LEN} printable characters")
    return name


def _metrics_dict(m: pb.NodeMetrics) -> dict:
    """The metrics as stored; a NaN loss is kept (the health view flags it), a bad rate is refused."""
    out = {name: getattr(m, name) for name in METRIC_FIELDS}
    if len(out["peer_id"]) > 128 or len(m.flagged_peers) > 64 or any(len(p) > 128 for p in m.flagged_peers):
        raise InvalidField("metrics.peer_id / metrics.flagged_peers: too long")
    if len(m.refused_peers) > 64 or any(len(p) > 128 for p in m.refused_peers):
        raise InvalidField("metrics.refused_peers: at most 64 peer ids of at most 128 characters")
    if len(m.last_group) > 64 or any(len(p) > 128 for p in m.last_group):
        raise InvalidField("metrics.last_group: at most 64 peer ids of at most 128 characters")
    out["last_group"] = list(m.last_group)
    out["flagged_peers"] = list(m.flagged_peers)
    out["refused_peers"] = list(m.refused_peers)
    for name in ("samples_per_s", "meet_s", "allreduce_s", "heartbeat_ms"):
        if not math.isfinite(out[name]) or out[name] < 0:
            raise InvalidField(f"metrics.{name}: must be finite and >= 0, got {out[name]}")
    if math.isinf(out["lr"]) or out["lr"] < 0:  # NaN: no step taken yet
        raise InvalidField(f"metrics.lr: must be finite and >= 0, got {out['lr']}")
    return out


class CoordinatorService(pb_grpc.CoordinatorServicer):
    """``issuer`` signs the members' data-plane credentials; ``prober`` dials nodes to learn whether peers can;
    ``publish_revocations(signed)`` puts a new revocation list on the DHT."""

    def __init__(self, store: Store, run: RunInfo, summary: SwarmSummary, issuer: Issuer, prober: Prober,
                 publish_revocations: Callable[[bytes], None] = lambda signed: None,
                 clock: Callable[[], float] = time.time):
        self.store, self.run, self.summary, self.clock = store, run, summary, clock
        self.issuer, self.prober, self.publish_revocations = issuer, prober, publish_revocations
        self.peers: dict[str, PeerRecord] = store.load_peers()
        #: node -> when its current credential was issued (unknown after a restart: renewed on the next heartbeat)
        self.issued: dict[str, float] = {}
        #: node -> the revocation list version it was last sent
        self.revocations_sent: dict[str, int] = {}
        self.nodes: dict[str, NodeRecord] = {n.node_id: n for n in store.load_nodes()}
        self.rates: dict[str, tuple[float, int, float]] = {}  # node -> (time, bytes_sent, bytes/s) at last heartbeat
        self.join_limiter = RateLimiter(*run.join_limit)
        self.heartbeat_limiter = RateLimiter(*run.heartbeat_limit)
        self.units: dict[tuple[int, int], Unit] = {(r.epoch, r.index): Unit(**r._asdict()) for r in store.load_units()}
        self.rules = SchedulingRules(run.unit_deadline_s)
        self.units_reissued = 0
        self.scheduling_reason = f"{len(run.unit_ranges)} work units per epoch"
        self.started = clock()

    # ---- helpers -------------------------------------------------------------------------------------------------
    def _views(self) -> list[NodeView]:
        return [NodeView(n.node_id, n.name, n.joined, n.last_seen, n.left, float(n.metrics.get("samples_per_s", 0.0)),
                         float(n.metrics.get("loss", math.nan)), int(n.metrics.get("step", 0)),
                         int(n.metrics.get("partial_rounds", 0)), int(n.metrics.get("rounds_completed", 0)))
                for n in self.nodes.values()]

    def _store_units(self, changed: list[Unit]) -> None:
        """Persist, then apply: nothing is answered before the units it changed are on disk."""
        if changed:
            self.store.save_units(changed)
            self.units.update({u.key: u for u in changed})

    def reclaim(self) -> None:
        """Units of nodes that are gone or past their deadline go back to the pool (the server calls this every
        second; Leave and GetWork call it too, so a leaver's units and a lost node's are free at once)."""
        now = self.clock()
        active = {n.node_id for n in active_nodes(now, self._views(), self.run.heartbeat_interval,
                                                  self.run.lost_after_missed)}
        reclaimed = reclaim_units(now, self.units, active)
        if reclaimed:
            self._store_units([u for u, _ in reclaimed])
            self.units_reissued += len(reclaimed)
            for _, why in reclaimed:
                logger.info("%s", why)
            self.scheduling_reason = reclaimed[-1][1]

    def forget_departed(self) -> None:
        """Drop what the service holds for nodes that left or went silent more than ``forget_after_s`` ago (the
        server calls this every second; the store keeps their records). Their units went back to the pool when they
        left or were lost; a forgotten node that comes back gets UNAUTHENTICATED and joins again."""
        for node_id, why in nodes_to_forget(self.clock(), self._views(), self.run.heartbeat_interval,
                                            self.run.lost_after_missed, self.run.forget_after_s, self.started):
            for table in (self.nodes, self.peers, self.issued, self.revocations_sent, self.rates):
                table.pop(node_id, None)
            self.store.forget_in_memory(node_id)
            logger.info("%s", why)

    async def _session(self, node_id: str, session: str, context) -> NodeRecord:
        node = self.nodes.get(node_id)
        if node is None or not session or not secrets.compare_digest(node.session_hash, hash_secret(session)):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown node_id or wrong session: join first")
        return node

    # ---- RPCs ----------------------------------------------------------------------------------------------------
    async def _rate_limit(self, limiter: RateLimiter, method: str, context) -> None:
        if not limiter.allow(peer_address(context.peer())):
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"rate limit: more than {limiter.rate:g} {method} calls per second from this address")

    async def Join(self, request: pb.JoinRequest, context) -> pb.JoinResponse:
        await self._rate_limit(self.join_limiter, "Join", context)
        if len(request.token) > MAX_TOKEN_LEN:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"token: longer than {MAX_TOKEN_LEN} characters")
        record = self.store.find_token(request.token) if request.token else None
        if record is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "token: missing or not valid for this coordinator")
        ok, why = record.usable(self.clock())
        if not ok:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"token: {why}")
        if request.protocol_version not in SUPPORTED_PROTOCOL_VERSIONS:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol_version {request.protocol_version} is not supported; this coordinator speaks "
                f"{', '.join(map(str, SUPPORTED_PROTOCOL_VERSIONS))}")
        try:
            name = _check_name(request.node_name)
            if request.node_id and (len(request.node_id) != 32 or any(c not in "0123456789abcdef"
                                                                       for c in request.node_id)):
                raise InvalidField("node_id: must be the 32 hex characters a coordinator handed out, or empty")
        except InvalidField as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        now = self.clock()
        session = secrets.token_urlsafe(24)
        caps = request.capabilities
        capabilities = dict(cpus=caps.cpus, gpus=caps.gpus, memory_bytes=caps.memory_bytes,
                            bandwidth_bps=caps.bandwidth_bps)
        previous = self.nodes.get(request.node_id) if request.node_id else None
        if record.max_nodes is not None:
            online = [v for v in active_nodes(now, self._views(), self.run.heartbeat_interval,
                                              self.run.lost_after_missed)
                      if self.nodes[v.node_id].token_name == record.name and v.node_id != request.node_id]
            if len(online) >= record.max_nodes:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"token: {record.name!r} allows {record.max_nodes} node(s) online at once and "
                                    f"has {len(online)}; stop one of them first")
        if previous is not None and previous.token_name == record.name:
            node = previous
            node.session_hash, node.last_seen, node.left, node.capabilities = hash_secret(session), now, False, capabilities
            node.name = name
            logger.info("node %s (%s) rejoined", name, node.node_id[:8])
        else:
            node = NodeRecord(uuid.uuid4().hex, name, record.name, hash_secret(session), now, now, False, capabilities, {})
            logger.info("node %s (%s) joined with token %r", name, node.node_id[:8], record.name)
        self.nodes[node.node_id] = node
        self.store.save_node(node)
        corpus = self.run.corpus
        spec = pb.RunSpec(run_id=self.run.run_id, config_toml=self.run.config_toml)
        if corpus is not None:
            spec.corpus_sha256, spec.train_bytes, spec.val_bytes = corpus.sha256, corpus.train.size, corpus.val.size
            spec.byte_counts.extend(self.run.byte_counts)
        return pb.JoinResponse(
            node_id=node.node_id, session=session, run=spec,
            initial_peers=self.run.initial_peers(), heartbeat_interval_s=self.run.heartbeat_interval,
            coordinator_public_key=self.issuer.public_key, credential_ttl_s=self.issuer.ttl)

    async def RegisterPeer(self, request: pb.RegisterPeerRequest, context) -> pb.RegisterPeerResponse:
        node = await self._session(request.node_id, request.session, context)
        if node.left or node.token_name in self._revoked_tokens():
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this node left or its token was revoked")
        try:
            peer, maddrs = parse_peer(request.peer_id, list(request.maddrs))
            if not request.record_public_key or len(request.record_public_key) > MAX_RECORD_KEY_BYTES:
                raise InvalidField(f"record_public_key: 1..{MAX_RECORD_KEY_BYTES} bytes")
        except (InvalidPeer, InvalidField) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        dialled, how = (None, "") if request.client_mode else await self.prober.dial(peer, maddrs)
        reachability, reason = reachability_decision(request.client_mode, dialled, how)
        record = PeerRecord(request.peer_id, bytes(request.record_public_key), reachability)
        self.store.save_peer(node.node_id, record)
        self.peers[node.node_id] = record
        self.issued[node.node_id] = self.clock()
        self.revocations_sent[node.node_id] = self.issuer.version
        logger.info("node %s (%s): peer ...%s is %s: %s", node.name, node.node_id[:8], request.peer_id[-8:],
                    reachability, reason)
        return pb.RegisterPeerResponse(
            reachability=reachability, reason=reason,
            credential=self.issuer.issue(node.node_id, request.peer_id, record.record_key),
            revocations=self.issuer.signed_revocations)

    # ---- revocation ----------------------------------------------------------------------------------------------
    def _revoked_tokens(self) -> set[str]:
        return self.store.revoked_token_names()

    def apply_revocations(self) -> bool:
        """Revoke the credentials of every node whose token was revoked (the operator's ``token revoke`` writes
        the store; the server calls this every second). True when the revocation list changed."""
        revoked = nodes_to_revoke(self._revoked_tokens(), ((n.node_id, n.token_name) for n in self.nodes.values()))
        if not self.issuer.revoke(revoked):
            return False
        self.publish_revocations(self.issuer.signed_revocations)
        return True

    async def Heartbeat(self, request: pb.HeartbeatRequest, context) -> pb.HeartbeatResponse:
        await self._rate_limit(self.heartbeat_limiter, "Heartbeat", context)
        return await self._heartbeat(request, context)

    async def HeartbeatStream(self, requests, context):
        async for request in requests:
            await self._rate_limit(self.heartbeat_limiter, "Heartbeat", context)
            yield await self._heartbeat(request, context)

    async def _heartbeat(self, request: pb.HeartbeatRequest, context) -> pb.HeartbeatResponse:
        node = await self._session(request.node_id, request.session, context)
        try:
            metrics = _metrics_dict(request.metrics)
        except InvalidField as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        now = self.clock()
        previous = self.rates.get(node.node_id)
        rate = 0.0
        if previous is not None and now > previous[0]:
            rate = max(0.0, (metrics["bytes_sent"] - previous[1]) / (now - previous[0]))
        self.rates[node.node_id] = (now, metrics["bytes_sent"], rate)
        node.last_seen, node.metrics = now, metrics
        self.store.record_heartbeat(node)
        if node.left:
            return pb.HeartbeatResponse(command=pb.DRAIN, reason="this node left the swarm; join again")
        if node.node_id in self.issuer.revoked:
            return pb.HeartbeatResponse(command=pb.DRAIN, reason="this node's token was revoked",
                                        revocations=self.issuer.signed_revocations)
        response = pb.HeartbeatResponse(command=pb.CONTINUE, reason="ok")
        peer = self.peers.get(node.node_id)
        if peer is not None and needs_renewal(self.issued.get(node.node_id, 0.0), now, self.issuer.ttl):
            response.credential = self.issuer.issue(node.node_id, peer.peer_id, peer.record_key)
            self.issued[node.node_id] = now
        if self.revocations_sent.get(node.node_id, -1) < self.issuer.version:
            response.revocations = self.issuer.signed_revocations
            self.revocations_sent[node.node_id] = self.issuer.version
        return response

    async def Leave(self, request: pb.LeaveRequest, context) -> pb.LeaveResponse:
        node = await self._session(request.node_id, request.session, context)
        if request.HasField("metrics"):
            try:
                node.metrics = _metrics_dict(request.metrics)
            except InvalidField as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        node.left, node.last_seen = True, self.clock()
        self.store.save_node(node)
        logger.info("node %s (%s) left: %s", node.name, node.node_id[:8], request.reason[:200] or "no reason given")
        self.reclaim()  # its units go back to the pool at once
        return pb.LeaveResponse()

    async def GetWork(self, request: pb.GetWorkRequest, context) -> pb.GetWorkResponse:
        node = await self._session(request.node_id, request.session, context)
        if node.left:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this node left the swarm; join again")
        node.last_seen = self.clock()  # asking for work is a sign of life
        self.reclaim()
        changed, unit, reason = issue_unit(self.clock(), self.units, self.run.unit_ranges, node.node_id, self.rules)
        self._store_units(changed)
        if unit is None:
            self.scheduling_reason = reason
            return pb.GetWorkResponse(reason=reason, retry_after_s=min(RETRY_WORK_S, self.run.heartbeat_interval))
        logger.info("node %s: %s", node.name, reason)
        return pb.GetWorkResponse(unit=pb.WorkUnit(epoch=unit.epoch, index=unit.index, start=unit.start, end=unit.end,
                                                   seed=unit.seed(self.run.seed), deadline_unix=unit.deadline),
                                  reason=reason)

    async def ReportWork(self, request: pb.ReportWorkRequest, context) -> pb.ReportWorkResponse:
        node = await self._session(request.node_id, request.session, context)
        if request.index >= max(1, len(self.run.unit_ranges)):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"index: {request.index} is not a work unit of this run (0..{len(self.run.unit_ranges) - 1})")
        done, accepted, reason = complete_unit(self.clock(), self.units, node.node_id, (request.epoch, request.index))
        if done is not None:
            self._store_units([done])
            old = finished_epochs(self.units)
            if old:
                self.store.forget_epochs(old)
                for key in [k for k in self.units if k[0] in old]:
                    del self.units[key]
        logger.info("node %s: %s", node.name, reason)
        return pb.ReportWorkResponse(accepted=accepted, reason=reason)

    async def ReadData(self, request: pb.ReadDataRequest, context) -> pb.DataChunk:
        await self._session(request.node_id, request.session, context)
        if self.run.corpus is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this run has no corpus: its nodes make their data")
        if request.split not in ("train", "val"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"split: must be 'train' or 'val', got {request.split!r}")
        if request.length == 0 or request.length > MAX_READ_BYTES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"length: must be in 1..{MAX_READ_BYTES}")
        split = self.run.corpus.split(request.split)
        if not split.start <= request.offset < split.end:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE,
                                f"offset: {request.offset} is outside the {request.split} split [{split.start}, {split.end})")
        length = min(request.length, split.end - request.offset)
        return pb.DataChunk(data=self.run.corpus.read(request.offset, length), offset=request.offset)

    async def GetCheckpoint(self, request: pb.GetCheckpointRequest, context):
        await self._session(request.node_id, request.session, context)
        for checkpoint in self.store.checkpoints():
            try:
                data = Path(checkpoint.path).read_bytes()
            except OSError as e:
                logger.warning("checkpoint %s cannot be read (%s); offering the previous one", checkpoint.path, e)
                continue
            if hashlib.sha256(data).hexdigest() != checkpoint.sha256:
                logger.warning("checkpoint %s is corrupt; offering the previous one", checkpoint.path)
                continue
            for start in range(0, len(data), CHECKPOINT_CHUNK):
                first = start == 0
                yield pb.CheckpointChunk(data=data[start: start + CHECKPOINT_CHUNK], total=len(data) if first else 0,
                                         round=checkpoint.round if first else 0,
                                         sha256=checkpoint.sha256 if first else "")
            return
        await context.abort(grpc.StatusCode.NOT_FOUND, "this coordinator has no checkpoint yet")

    async def GetSwarmHealth(self, request: pb.GetSwarmHealthRequest, context) -> pb.SwarmHealth:
        return self.health()

    def health(self) -> pb.SwarmHealth:
        """The swarm as it stands; reads only (lost nodes' units go back to the pool on :meth:`reclaim`)."""
        now = self.clock()
        views = self._views()
        rows, states = [], []
        by_peer = self._names_by_peer()
        totals = pb.SwarmTotals(val_loss=self.summary.val_loss, val_bpc=self.summary.val_bpc,
                                val_round=self.summary.val_round, latest_checkpoint=self.summary.latest_checkpoint,
                                latest_checkpoint_round=self.summary.latest_checkpoint_round,
                                val_metrics={k: float(v) for k, v in self.summary.val_metrics.items()},
                                units_reissued=self.units_reissued, scheduling_reason=self.scheduling_reason)
        epoch = current_epoch(self.units)
        counts = unit_counts(self.units, epoch)
        if counts["total"] == 0:  # not opened yet: every unit is pending
            counts.update(total=len(self.run.unit_ranges), pending=len(self.run.unit_ranges))
        totals.epoch, totals.units_total, totals.units_pending = epoch, counts["total"], counts["pending"]
        totals.units_in_progress, totals.units_done = counts["in_progress"], counts["done"]
        for view, node in zip(views, self.nodes.values()):
            state, reason = node_state(now, view, views, self.run.heartbeat_interval, self.run.lost_after_missed)
            states.append((view, state, reason))
            m = pb.NodeMetrics(**{k: v for k, v in node.metrics.items() if k in METRIC_FIELDS},
                               flagged_peers=node.metrics.get("flagged_peers", []),
                               refused_peers=node.metrics.get("refused_peers", []),
                               last_group=node.metrics.get("last_group", []))
            rows.append(pb.NodeHealth(node_id=node.node_id, node_name=node.name, state=state, metrics=m,
                                      last_seen_unix=node.last_seen, joined_unix=node.joined, reason=reason,
                                      bytes_per_s=self.rates.get(node.node_id, (0, 0, 0.0))[2]
                                      if state in ("healthy", "straggler") else 0.0,
                                      units=[u.name for u in held_by(self.units, node.node_id)],
                                      reachability=self.peers[node.node_id].reachability
                                      if node.node_id in self.peers else "",
                                      groupmates=[by_peer.get(p, f"peer ...{p[-8:]}") for p in m.last_group]))
            if state in ("healthy", "straggler"):
                totals.nodes_online += 1
                totals.samples_per_s += m.samples_per_s
            totals.global_round = max(totals.global_round, m.round)
            totals.samples_total = max(totals.samples_total, m.samples_total)
            totals.bytes_sent += m.bytes_sent
            totals.bytes_received += m.bytes_received
        alerts = swarm_alerts(states) + self._flag_alerts() + self._refusal_alerts()
        return pb.SwarmHealth(run_id=self.run.run_id, nodes=rows, totals=totals, alerts=alerts, now_unix=now)

    def _names_by_peer(self) -> dict[str, str]:
        """Node names by the peer id each last reported."""
        return {n.metrics.get("peer_id"): n.name for n in self.nodes.values() if n.metrics.get("peer_id")}

    def _flag_alerts(self) -> list[str]:
        """Nodes whose contributions their peers dropped (non-finite or malformed updates)."""
        by_peer = self._names_by_peer()
        flagged: dict[str, int] = {}
        for node in self.nodes.values():
            for peer in node.metrics.get("flagged_peers", []):
                flagged[peer] = flagged.get(peer, 0) + 1
        return [f"{by_peer.get(peer, 'peer ' + peer[-8:])}: sent non-finite or malformed updates; dropped by "
                f"{count} peer(s)" for peer, count in sorted(flagged.items())]

    def _refusal_alerts(self) -> list[str]:
        """Peers that members refused on the data plane (no valid credential: strangers, revoked or expired)."""
        by_peer = {p.peer_id: self.nodes[n].name for n, p in self.peers.items() if n in self.nodes}
        refused: dict[str, int] = {}
        for node in self.nodes.values():
            if node.left:
                continue
            for peer in node.metrics.get("refused_peers", []):
                refused[peer] = refused.get(peer, 0) + 1
        return [f"{by_peer[peer] + ' (revoked or expired)' if peer in by_peer else 'unknown peer ...' + peer[-8:]}: "
                f"refused on the data plane by {count} member(s)" for peer, count in sorted(refused.items())]
