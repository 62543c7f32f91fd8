"""What the validator takes in from nodes: a heartbeat's part in verification (:func:`heartbeat_verification`), and
``SubmitEvidence``, a node's upload of the evidence a heartbeat's answer asked for (:func:`take_evidence`).

The upload is hostile input until the validator has checked it: the first chunk must name a known node with its
session and the very round the validator asked that node for, the whole may hold no more bytes than the run's model
needs (:meth:`cotrain.coordinator.validation.Validator.max_evidence_bytes`) and must arrive within :data:`UPLOAD_DEADLINE_S`.
"""

from __future__ import annotations

import time
from typing import Awaitable, Callable

import grpc

from cotrain.v1 import coordinator_pb2 as pb
from cotrain.verification.witness import PartSeen

from cotrain.coordinator.validation import Candidate, Validator

#: seconds an upload may take: a model's evidence is megabytes, which a volunteer's uplink sends in seconds; a
#: slower one is dropped and the node is asked again for a later round
UPLOAD_DEADLINE_S = 120.0


def heartbeat_verification(validator: Validator, who: Candidate | None, request: pb.HeartbeatRequest,
                           response: pb.HeartbeatResponse, refusals) -> None:
    """A heartbeat's part in verification: the commitments and the reducers' reports it carries, and whether to ask
    for its evidence (``response.evidence_round``). What is refused is noted with ``refusals`` (one warning a minute
    at most, counting the rest)."""
    if who is None:  # no DHT peer registered yet: nothing to check a signature against
        return
    refused = validator.take_commitments(who, request.commitments) if request.commitments else ""
    if request.parts_seen:
        parts = [PartSeen(p.round, p.member, p.start, p.end, p.digest, p.signature, p.contribution)
                 for p in request.parts_seen]
        refused = "; ".join(filter(None, [refused, validator.take_parts_seen(who, parts)]))
    if refused:
        refusals.note(f"node {who.node_id[:8]}: verification refused: {refused[:500]}")
    if request.evidence_round:
        response.evidence_round = validator.wants(who.node_id, request.evidence_round)


async def take_evidence(requests, context, *, validator: Validator | None,
                        session: Callable[[str, str, object], Awaitable], who: Callable[[str], Candidate | None],
                        clock: Callable[[], float] = time.monotonic) -> pb.SubmitEvidenceResponse:
    """Read the upload from ``requests`` and queue it with ``validator``. ``session(node_id, session, context)``
    checks the caller (it aborts UNAUTHENTICATED); ``who(node_id)``: the node as the coordinator knows it."""
    node, round_number, data, started = None, 0, bytearray(), clock()
    limit = validator.max_evidence_bytes() if validator is not None else 0
    async for chunk in requests:
        if node is None:
            node = await session(chunk.node_id, chunk.session, context)
            if validator is None:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "verification is off in this run")
            round_number = chunk.round
            asked = validator.requested(node.node_id)
            if round_number == 0 or round_number != asked:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"round: {round_number} was not asked for (asked: {asked or 'none'})")
        data += chunk.data
        if len(data) > limit:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"data: more than {limit} bytes, the most this run's evidence takes")
        if clock() - started > UPLOAD_DEADLINE_S:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"data: the upload took more than {UPLOAD_DEADLINE_S:.0f} s")
    if node is None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node_id: no chunk came")
    candidate = who(node.node_id)
    if candidate is None:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "node_id: this node has no registered DHT peer")
    refused = validator.offer(candidate, round_number, bytes(data))
    return pb.SubmitEvidenceResponse(accepted=not refused, reason=refused or "queued for checking")
