"""The coordinator's side of expert hosts (issue 56): the ``ReportExperts`` and ``GetExperts`` calls, hostile until
checked, over the service's :class:`~cotrain.coordinator.expert_pool.ExpertPool` (None: the run has no experts).

A host is a member that registered a peer the coordinator could dial (trainers call it; one behind NAT could not be
called), and its report names at most :data:`~cotrain.coordinator.expert_pool.MAX_CAPACITY` experts of at most
:data:`MAX_UID_CHARS` characters each.
"""

from __future__ import annotations

import grpc

from cotrain.coordinator.expert_pool import MAX_CAPACITY, ExpertPool
from cotrain.coordinator.reachability import PUBLIC
from cotrain.v1 import coordinator_pb2 as pb

MAX_UID_CHARS = 128


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
    node.last_seen = service.clock()  # a report is a sign of life
    uids = pool.report(node.node_id, peer.peer_id, request.capacity, list(request.holds))
    return pb.ReportExpertsResponse(uids=uids, reason=pool.status()[2])


async def get_experts(service, request: pb.GetExpertsRequest, context) -> pb.GetExpertsResponse:
    await service._session(request.node_id, request.session, context)
    pool = await _pool(service, context)
    entries = [pb.ExpertHostEntry(uid=uid, peer_id=peer) for uid, peer in sorted(pool.directory().items())]
    return pb.GetExpertsResponse(experts=entries, reason=pool.status()[2])


async def _pool(service, context) -> ExpertPool:
    if service.experts is None:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this run has no experts (model.kind is not "
                            "\"moe_lstm\")")
    return service.experts
