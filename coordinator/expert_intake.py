"""The coordinator's side of expert hosts (issue 56): the ``ReportExperts`` and ``GetExperts`` calls, hostile until
checked, over the service's :class:`~cotrain.coordinator.expert_pool.ExpertPool` (None: the run has no experts).

A host is a member that registered a peer the coordinator could dial (trainers call it; one behind NAT could not be
called), and its report names at most :data:`~cotrain.coordinator.expert_pool.MAX_CAPACITY` experts of at most
:data:`MAX_UID_CHARS` characters each.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from cotrain.coordinator.expert_pool import MAX_CAPACITY, ExpertPool, Load
from cotrain.coordinator.reachability import PUBLIC
from cotrain.moe.expert_state import ExpertStateError
from cotrain.v1 import coordinator_pb2 as pb

MAX_UID_CHARS = 128
#: seconds an expert's upload may take: megabytes, which a host's uplink sends in seconds
UPLOAD_DEADLINE_S = 120.0
CHUNK_BYTES = 1 << 20


async def report_experts(service, request: pb.ReportExpertsRequest, context) -> pb.ReportExpertsResponse:
    node = await service._session(request.node_id, request.session, context)
    pool: ExpertPool = await _pool(service, context)
    peer = service.peers.get(node.node_id)
    if node.left or peer is None or peer.reachability != PUBLIC:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "an expert host must be a member whose peer the "
                            "coordinator could dial (RegisterPeer, not in client mode): trainers call it")
    if len(request.holds) > MAX_CAPACITY or any(len(u) > MAX_UID_CHARS for u in request.holds):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"holds: at most {MAX_CAPACITY} uids of at most "
                            f"{MAX_UID_CHARS} characters")
    if len(request.served) > MAX_CAPACITY or any(len(e.uid) > MAX_UID_CHARS for e in request.served):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"served: at most {MAX_CAPACITY} entries whose uid "
                            f"has at most {MAX_UID_CHARS} characters")
    node.last_seen = service.clock()  # a report is a sign of life
    uids = pool.report(node.node_id, peer.peer_id, request.capacity, list(request.holds),
                       [Load(e.uid, e.forward, e.backward, e.updates, e.started_from) for e in request.served],
                       request.refused)
    return pb.ReportExpertsResponse(uids=uids, reason=pool.status()[2])


async def get_experts(service, request: pb.GetExpertsRequest, context) -> pb.GetExpertsResponse:
    await service._session(request.node_id, request.session, context)
    pool = await _pool(service, context)
    entries = [pb.ExpertHostEntry(uid=uid, peer_id=peer) for uid, peer in sorted(pool.directory().items())]
    return pb.GetExpertsResponse(experts=entries, reason=pool.status()[2])


async def save_expert(service, requests, context, clock=time.monotonic) -> pb.SaveExpertResponse:
    """A host's upload of an expert's checkpoint: the first chunk names the node, its session and an expert the pool
    gave it; at most the bytes the run's expert takes, within :data:`UPLOAD_DEADLINE_S`; checked before it is kept."""
    node, uid, data, started = None, "", bytearray(), clock()
    keeper = service.expert_checkpoints
    async for chunk in requests:
        if node is None:
            node = await service._session(chunk.node_id, chunk.session, context)
            pool = await _pool(service, context)
            uid = chunk.uid
            if pool.holder(uid) != node.node_id:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"uid: {uid[:MAX_UID_CHARS]!r} is not an "
                                    "expert this host was given")
        data += chunk.data
        if len(data) > keeper.max_bytes:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"data: more than {keeper.max_bytes} bytes, the "
                                "most this run's expert takes")
        if clock() - started > UPLOAD_DEADLINE_S:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"data: the upload took more than {UPLOAD_DEADLINE_S:.0f} s")
    if node is None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node_id: no chunk came")
    try:
        updates = await asyncio.to_thread(keeper.save, uid, bytes(data))
    except ExpertStateError as e:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    return pb.SaveExpertResponse(updates=updates)


async def load_expert(service, request: pb.LoadExpertRequest, context):
    """An expert's last checkpoint, in chunks, for the host the pool gave it to."""
    node = await service._session(request.node_id, request.session, context)
    pool = await _pool(service, context)
    if pool.holder(request.uid) != node.node_id:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"uid: {request.uid[:MAX_UID_CHARS]!r} is not an "
                            "expert this host was given")
    data = await asyncio.to_thread(service.expert_checkpoints.load, request.uid)
    if data is None:
        await context.abort(grpc.StatusCode.NOT_FOUND, f"uid: no checkpoint of {request.uid!r} yet")
    for at in range(0, len(data), CHUNK_BYTES):
        yield pb.ExpertChunk(uid=request.uid, data=data[at:at + CHUNK_BYTES])


def experts_health(pool: ExpertPool, names: dict[str, str]) -> pb.ExpertsHealth:
    """The pool as the health view shows it; ``names``: node id -> the name it joined with."""
    hosts, hosted, reason = pool.status()
    return pb.ExpertsHealth(experts=len(pool.uids), hosted=hosted, reason=reason, hosts=[
        pb.ExpertHostHealth(node_id=h.node_id, node_name=names.get(h.node_id, h.node_id[:8]), peer_id=h.peer_id,
                            capacity=h.capacity, holds=list(h.holds), refused=h.refused, last_report_unix=h.at,
                            served=[pb.ExpertLoad(uid=x.uid, forward=x.forward, backward=x.backward,
                                                  updates=x.updates, started_from=x.started_from)
                                    for x in h.served])
        for h in pool.hosts()])


async def _pool(service, context) -> ExpertPool:
    if service.experts is None:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this run has no experts (model.kind is not "
                            "\"moe_lstm\")")
    return service.experts


class ExpertCalls:
    """The expert hosts' RPCs of :class:`~cotrain.coordinator.service.CoordinatorService`, over its session check,
    its peers and its ``experts`` pool and ``expert_checkpoints``."""

    async def ReportExperts(self, request: pb.ReportExpertsRequest, context) -> pb.ReportExpertsResponse:
        return await report_experts(self, request, context)

    async def GetExperts(self, request: pb.GetExpertsRequest, context) -> pb.GetExpertsResponse:
        return await get_experts(self, request, context)

    async def SaveExpert(self, requests, context) -> pb.SaveExpertResponse:
        return await save_expert(self, requests, context)

    async def LoadExpert(self, request: pb.LoadExpertRequest, context):
        async for chunk in load_expert(self, request, context):
            yield chunk
