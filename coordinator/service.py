"""The gRPC ``Coordinator`` service: admission, heartbeats, work units, data, health.

Runs on one asyncio loop; the in-memory view of the nodes is mirrored to the SQLite :class:`Store` before any answer
leaves, so a restarted coordinator knows every member it had acknowledged. The service checks each request and
answers with its status codes; the jobs behind it are parts of their own: the work units
(:class:`~cotrain.coordinator.unit_pool.UnitPool`), a node's metrics (:mod:`node_metrics`), the checkpoint a node
downloads (:mod:`checkpoint_serving`) and the health view (:mod:`swarm_health`).
"""

from __future__ import annotations

import logging
import math
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional

import grpc

from cotrain.data import Corpus
from cotrain.protocol import MAX_READ_BYTES, SUPPORTED_PROTOCOL_VERSIONS
from cotrain.v1 import coordinator_pb2 as pb
from cotrain.v1 import coordinator_pb2_grpc as pb_grpc

from cotrain.coordinator.admission import Issuer, needs_renewal, nodes_to_revoke
from cotrain.coordinator.checkpoint_serving import checkpoint_chunks, newest_intact
from cotrain.coordinator.membership import NodeView, active_nodes, nodes_to_forget
from cotrain.coordinator.node_metrics import InvalidMetrics, metrics_dict
from cotrain.coordinator.reachability import InvalidPeer, Prober, parse_peer, reachability_decision
from cotrain.coordinator.ratelimit import RateLimiter, peer_address
from cotrain.coordinator.store import NodeRecord, PeerRecord, Store, hash_secret
from cotrain.coordinator.swarm_health import SwarmSummary, swarm_health
from cotrain.coordinator.unit_pool import UnitPool
from cotrain.coordinator.evidence_intake import heartbeat_verification, take_evidence
from cotrain.coordinator.expert_checkpoints import ExpertCheckpoints
from cotrain.coordinator.expert_intake import ExpertCalls, experts_health
from cotrain.coordinator.expert_pool import ExpertPool
from cotrain.coordinator.validation import Candidate, Validator
from cotrain.coordinator.wire import ThrottledWarning

logger = logging.getLogger(__name__)

MAX_NAME_LEN = 64
MAX_TOKEN_LEN = 256
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
    #: the uids of the run's experts (model.kind "moe_lstm": cotrain.moe.assignment.run_experts); none: no experts
    experts: list = field(default_factory=list)


class InvalidField(ValueError):
    pass


def _check_name(name: str) -> str:
    if not name or len(name) > MAX_NAME_LEN or not name.isprintable():
        raise InvalidField(f"node_name: must be 1..{MAX_NAME_LEN} printable characters")
    return name


class CoordinatorService(ExpertCalls, pb_grpc.CoordinatorServicer):
    """``issuer`` signs the members' data-plane credentials; ``prober`` dials nodes to learn whether peers can;
    ``publish_revocations(signed)`` puts a new revocation list on the DHT."""

    def __init__(self, store: Store, run: RunInfo, summary: SwarmSummary, issuer: Issuer, prober: Prober,
                 publish_revocations: Callable[[bytes], None] = lambda signed: None,
                 clock: Callable[[], float] = time.time, validator: Optional[Validator] = None,
                 expert_checkpoints: Optional[ExpertCheckpoints] = None):
        self.store, self.run, self.summary, self.clock = store, run, summary, clock
        self.issuer, self.prober, self.publish_revocations = issuer, prober, publish_revocations
        self.peers: dict[str, PeerRecord] = store.load_peers()
        #: node -> when its current credential was issued (unknown after a restart: renewed on the next heartbeat)
        self.issued: dict[str, float] = {}
        #: node -> the reputation its current credential carries (verification)
        self.issued_reputation: dict[str, float] = {}
        #: node -> the revocation list version it was last sent
        self.revocations_sent: dict[str, int] = {}
        self.nodes: dict[str, NodeRecord] = {n.node_id: n for n in store.load_nodes()}
        self.rates: dict[str, tuple[float, int, float]] = {}  # node -> (time, bytes_sent, bytes/s) at last heartbeat
        self.join_limiter = RateLimiter(*run.join_limit)
        self.heartbeat_limiter = RateLimiter(*run.heartbeat_limit)
        self.units = UnitPool(store, run.unit_ranges, run.unit_deadline_s)
        self.started = clock()
        #: verification.enabled: checks sampled contributions, and names the nodes to suspend
        self.validator = validator
        #: model.kind "moe_lstm": which host holds which expert
        self.experts: Optional[ExpertPool] = ExpertPool(run.experts, now=clock) if run.experts else None
        #: the experts' last checkpoints, for the hosts they move to
        self.expert_checkpoints = expert_checkpoints
        self.refusals = ThrottledWarning(logger)

    # ---- helpers -------------------------------------------------------------------------------------------------
    def _views(self) -> list[NodeView]:
        return [NodeView(n.node_id, n.name, n.joined, n.last_seen, n.left, float(n.metrics.get("samples_per_s", 0.0)),
                         float(n.metrics.get("loss", math.nan)), int(n.metrics.get("step", 0)),
                         int(n.metrics.get("partial_rounds", 0)), int(n.metrics.get("rounds_completed", 0)))
                for n in self.nodes.values()]

    def reclaim(self) -> None:
        """Units of nodes that are gone or past their deadline go back to the pool (the server calls this every
        second; Leave and GetWork call it too, so a leaver's units and a lost node's are free at once)."""
        now = self.clock()
        active = {n.node_id for n in active_nodes(now, self._views(), self.run.heartbeat_interval,
                                                  self.run.lost_after_missed)}
        for why in self.units.reclaim(now, active):
            logger.info("%s", why)

    def forget_departed(self) -> None:
        """Drop what the service holds for nodes that left or went silent more than ``forget_after_s`` ago (the
        server calls this every second; the store keeps their records). Their units went back to the pool when they
        left or were lost; a forgotten node that comes back gets UNAUTHENTICATED and joins again."""
        for node_id, why in nodes_to_forget(self.clock(), self._views(), self.run.heartbeat_interval,
                                            self.run.lost_after_missed, self.run.forget_after_s, self.started):
            for table in (self.nodes, self.peers, self.issued, self.issued_reputation, self.revocations_sent,
                          self.rates):
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
            node.session_hash, node.last_seen, node.left = hash_secret(session), now, False
            node.capabilities, node.name = capabilities, name
            logger.info("node %s (%s) rejoined", name, node.node_id[:8])
        else:
            node = NodeRecord(uuid.uuid4().hex, name, record.name, hash_secret(session), now, now, False,
                              capabilities, {})
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
        if self.validator is not None:
            revoked |= self.validator.suspended()
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
            metrics = metrics_dict(request.metrics)
        except InvalidMetrics as e:
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
            why = "this node failed the checks of its contributions" if node.node_id in (
                self.validator.suspended() if self.validator else ()) else "this node's token was revoked"
            return pb.HeartbeatResponse(command=pb.DRAIN, reason=why, revocations=self.issuer.signed_revocations)
        response = pb.HeartbeatResponse(command=pb.CONTINUE, reason="ok")
        if self.validator is not None:
            heartbeat_verification(self.validator, self._candidate(node.node_id), request, response, self.refusals)
        peer = self.peers.get(node.node_id)
        reputation = self.validator.weight(node.node_id) if self.validator is not None else 1.0
        if peer is not None and (needs_renewal(self.issued.get(node.node_id, 0.0), now, self.issuer.ttl)
                                 or abs(reputation - self.issued_reputation.get(node.node_id, 1.0)) >= 0.05):
            response.credential = self.issuer.issue(node.node_id, peer.peer_id, peer.record_key,
                                                    reputation=reputation)
            self.issued[node.node_id], self.issued_reputation[node.node_id] = now, reputation
        if self.revocations_sent.get(node.node_id, -1) < self.issuer.version:
            response.revocations = self.issuer.signed_revocations
            self.revocations_sent[node.node_id] = self.issuer.version
        return response

    async def SubmitEvidence(self, requests, context) -> pb.SubmitEvidenceResponse:
        return await take_evidence(requests, context, validator=self.validator, session=self._session,
                                   who=self._candidate)

    def _candidate(self, node_id: str) -> Optional[Candidate]:
        node, peer = self.nodes.get(node_id), self.peers.get(node_id)
        if node is None or peer is None:
            return None
        return Candidate(node_id, node.token_name, peer.peer_id, peer.record_key)

    async def Leave(self, request: pb.LeaveRequest, context) -> pb.LeaveResponse:
        node = await self._session(request.node_id, request.session, context)
        if request.HasField("metrics"):
            try:
                node.metrics = metrics_dict(request.metrics)
            except InvalidMetrics as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        node.left, node.last_seen = True, self.clock()
        self.store.save_node(node)
        logger.info("node %s (%s) left: %s", node.name, node.node_id[:8], request.reason[:200] or "no reason given")
        self.reclaim()  # its units go back to the pool at once
        if self.experts is not None:
            self.experts.leave(node.node_id)  # and its experts to other hosts
        return pb.LeaveResponse()

    async def GetWork(self, request: pb.GetWorkRequest, context) -> pb.GetWorkResponse:
        node = await self._session(request.node_id, request.session, context)
        if node.left:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this node left the swarm; join again")
        node.last_seen = self.clock()  # asking for work is a sign of life
        self.reclaim()
        unit, reason = self.units.issue(self.clock(), node.node_id)
        if unit is None:
            return pb.GetWorkResponse(reason=reason, retry_after_s=min(RETRY_WORK_S, self.run.heartbeat_interval))
        logger.info("node %s: %s", node.name, reason)
        return pb.GetWorkResponse(unit=pb.WorkUnit(epoch=unit.epoch, index=unit.index, start=unit.start, end=unit.end,
                                                   seed=unit.seed(self.run.seed), deadline_unix=unit.deadline),
                                  reason=reason)

    async def ReportWork(self, request: pb.ReportWorkRequest, context) -> pb.ReportWorkResponse:
        node = await self._session(request.node_id, request.session, context)
        if request.index >= max(1, len(self.run.unit_ranges)):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"index: {request.index} is not a work unit of this run "
                                f"(0..{len(self.run.unit_ranges) - 1})")
        accepted, reason = self.units.complete(self.clock(), node.node_id, (request.epoch, request.index))
        logger.info("node %s: %s", node.name, reason)
        return pb.ReportWorkResponse(accepted=accepted, reason=reason)

    async def ReadData(self, request: pb.ReadDataRequest, context) -> pb.DataChunk:
        await self._session(request.node_id, request.session, context)
        if self.run.corpus is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "this run has no corpus: its nodes make their data")
        if request.split not in ("train", "val"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"split: must be 'train' or 'val', got {request.split!r}")
        if request.length == 0 or request.length > MAX_READ_BYTES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"length: must be in 1..{MAX_READ_BYTES}")
        split = self.run.corpus.split(request.split)
        if not split.start <= request.offset < split.end:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE,
                                f"offset: {request.offset} is outside the {request.split} split "
                                f"[{split.start}, {split.end})")
        length = min(request.length, split.end - request.offset)
        return pb.DataChunk(data=self.run.corpus.read(request.offset, length), offset=request.offset)

    async def GetCheckpoint(self, request: pb.GetCheckpointRequest, context):
        await self._session(request.node_id, request.session, context)
        found = newest_intact(self.store.checkpoints())
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "this coordinator has no checkpoint yet")
        for chunk in checkpoint_chunks(*found):
            yield chunk

    async def GetSwarmHealth(self, request: pb.GetSwarmHealthRequest, context) -> pb.SwarmHealth:
        return self.health()

    def health(self) -> pb.SwarmHealth:
        """The swarm as it stands; reads only (lost nodes' units go back to the pool on :meth:`reclaim`)."""
        now = self.clock()
        health = swarm_health(now, run_id=self.run.run_id, heartbeat_interval=self.run.heartbeat_interval,
                              lost_after_missed=self.run.lost_after_missed, summary=self.summary, nodes=self.nodes,
                              views=self._views(), peers=self.peers, rates=self.rates, units=self.units,
                              verdicts=self.validator.verdicts() if self.validator is not None else None,
                              validator_totals=self.validator.totals() if self.validator is not None else None)
        if self.experts is not None:
            health.experts.CopyFrom(experts_health(self.experts, {n.node_id: n.name for n in self.nodes.values()}))
        return health
