"""The node's side of the control plane: a thin, retrying client of the coordinator's gRPC service."""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import random
import threading
import time
from typing import Callable, Optional, Sequence, TypeVar

import grpc

from cotrain.protocol import MAX_READ_BYTES, PROTOCOL_VERSION, open_channel
from cotrain.v1 import coordinator_pb2 as pb
from cotrain.v1 import coordinator_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: evidence goes up in chunks of this size (a model's is 8 bytes a parameter: megabytes)
EVIDENCE_CHUNK_BYTES = 1 << 20

#: errors worth retrying: the coordinator is restarting or the link dropped
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)


class JoinRefused(Exception):
    """The coordinator answered, and said no (bad token, unsupported protocol, bad field)."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


class CoordinatorUnavailable(Exception):
    pass


class HeartbeatStream:
    """A long-lived ``HeartbeatStream`` call: each :meth:`send` writes one request and waits for its answer. A
    heartbeat on an open stream costs the coordinator a fraction of a unary call, which is what lets one coordinator
    take thousands of nodes."""

    _CLOSE = object()

    def __init__(self, stub):
        self._requests: queue.Queue = queue.Queue()
        self._call = stub.HeartbeatStream(iter(self._next_request, None))
        self._responses = iter(self._call)

    def _next_request(self):
        item = self._requests.get()
        return None if item is self._CLOSE else item  # None ends the iterator: the stream's half-close

    def send(self, request: pb.HeartbeatRequest, timeout: float) -> pb.HeartbeatResponse:
        self._requests.put(request)
        timer = threading.Timer(timeout, self._call.cancel)  # no answer in time: end the call, the caller retries
        timer.start()
        try:
            return next(self._responses)
        except StopIteration:
            raise _StreamEnded() from None
        finally:
            timer.cancel()

    def close(self) -> None:
        self._requests.put(self._CLOSE)
        self._call.cancel()


class _StreamEnded(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the coordinator ended the heartbeat stream"


class CoordinatorClient:
    def __init__(self, address: str, insecure: bool, ca_path: Optional[str] = None, rpc_timeout: float = 10.0):
        self.address = address
        self.channel = open_channel(address, insecure, ca_path)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.rpc_timeout = rpc_timeout
        self.node_id = ""
        self.session = ""
        self._lock = threading.Lock()
        self._heartbeats: Optional[HeartbeatStream] = None

    def close(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.close()
        self.channel.close()

    def __enter__(self) -> "CoordinatorClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _retry(self, call: Callable[[], T], what: str, give_up_after: float, stop: Optional[threading.Event] = None) -> T:
        """Retry with exponential backoff and jitter while the coordinator is unreachable."""
        deadline = time.monotonic() + give_up_after
        delay = 0.5
        while True:
            try:
                return call()
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE:
                    raise
                if time.monotonic() + delay > deadline or (stop is not None and stop.is_set()):
                    raise CoordinatorUnavailable(f"{what}: coordinator at {self.address} unreachable: "
                                                 f"{e.code().name} {e.details()}") from None
                logger.info("%s: coordinator unreachable (%s); retrying in %.1fs", what, e.code().name, delay)
                if stop is not None:
                    stop.wait(delay)
                else:
                    time.sleep(delay)
                delay = min(delay * 2, 10.0) * random.uniform(0.8, 1.2)

    def join(self, token: str, node_name: str, node_id: str = "", give_up_after: float = 60.0,
             protocol_version: int = PROTOCOL_VERSION) -> pb.JoinResponse:
        request = pb.JoinRequest(
            token=token, node_name=node_name, protocol_version=protocol_version, node_id=node_id,
            capabilities=pb.Capabilities(cpus=os.cpu_count() or 1, gpus=_gpu_count(), memory_bytes=_memory_bytes()))
        try:
            response = self._retry(lambda: self.stub.Join(request, timeout=self.rpc_timeout), "join", give_up_after)
        except grpc.RpcError as e:
            raise JoinRefused(e.code(), e.details()) from None
        self.node_id, self.session = response.node_id, response.session
        return response

    def register_peer(self, peer_id: str, maddrs: list[str], record_public_key: bytes, client_mode: bool,
                      give_up_after: float = 60.0) -> pb.RegisterPeerResponse:
        """Tell the coordinator this node's DHT peer; it dials it (unless ``client_mode``) and issues the node's
        data-plane credential. The dial takes up to a few seconds, hence the longer timeout."""
        request = pb.RegisterPeerRequest(node_id=self.node_id, session=self.session, peer_id=peer_id, maddrs=maddrs,
                                         record_public_key=record_public_key, client_mode=client_mode)
        return self._retry(lambda: self.stub.RegisterPeer(request, timeout=self.rpc_timeout + 10.0), "register peer",
                           give_up_after)

    def report_experts(self, capacity: int, holds: Sequence[str], give_up_after: float = 10.0,
                       served: Sequence[pb.ExpertLoad] = (), refused: int = 0) -> pb.ReportExpertsResponse:
        """An expert host's report (what it will hold, what it holds, what each held expert did, the calls it
        refused) -> what it is to hold."""
        request = pb.ReportExpertsRequest(node_id=self.node_id, session=self.session, capacity=capacity,
                                          holds=list(holds), refused=refused, served=list(served))
        return self._retry(lambda: self.stub.ReportExperts(request, timeout=self.rpc_timeout), "report experts",
                           give_up_after)

    def experts(self, give_up_after: float = 10.0) -> dict[str, str]:
        """Each expert's host peer id, for a trainer's mixture layers."""
        request = pb.GetExpertsRequest(node_id=self.node_id, session=self.session)
        answer = self._retry(lambda: self.stub.GetExperts(request, timeout=self.rpc_timeout), "get experts",
                             give_up_after)
        return {e.uid: e.peer_id for e in answer.experts}

    def save_expert(self, uid: str, data: bytes, timeout: float = 120.0) -> pb.SaveExpertResponse:
        """An expert host's checkpoint of ``uid`` (cotrain.moe.expert_state), uploaded in chunks."""
        first = pb.ExpertChunk(node_id=self.node_id, session=self.session, uid=uid)
        return self.stub.SaveExpert(upload_chunks(first, data, pb.ExpertChunk), timeout=timeout)

    def load_expert(self, uid: str, timeout: float = 120.0) -> Optional[bytes]:
        """``uid``'s last checkpoint at the coordinator, or None when it has none."""
        request = pb.LoadExpertRequest(node_id=self.node_id, session=self.session, uid=uid)
        try:
            return b"".join(chunk.data for chunk in self.stub.LoadExpert(request, timeout=timeout))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def heartbeat(self, metrics: pb.NodeMetrics, evidence_round: int = 0, commitments: Sequence[bytes] = (),
                  parts_seen: Sequence = ()) -> pb.HeartbeatResponse:
        """One heartbeat on this node's heartbeat stream (opened on first use, and again after it broke); raises
        grpc.RpcError when the coordinator does not answer within ``rpc_timeout``. ``evidence_round``: the latest
        round whose evidence this node keeps for a validator (0: none), ``commitments`` those rounds' commitments,
        ``parts_seen`` what it reduced of its groupmates' (:class:`cotrain.verification.witness.PartSeen`)."""
        request = pb.HeartbeatRequest(node_id=self.node_id, session=self.session, metrics=metrics,
                                      evidence_round=evidence_round, commitments=list(commitments),
                                      parts_seen=[pb.PartSeen(round=p.round, member=p.member, start=p.start,
                                                              end=p.end, digest=p.digest, signature=p.signature,
                                                              contribution=p.contribution)
                                                  for p in parts_seen])
        with self._lock:
            if self._heartbeats is None:
                self._heartbeats = HeartbeatStream(self.stub)
            try:
                return self._heartbeats.send(request, self.rpc_timeout)
            except grpc.RpcError:
                self._heartbeats.close()
                self._heartbeats = None
                raise

    def leave(self, reason: str, metrics: Optional[pb.NodeMetrics] = None) -> None:
        self.stub.Leave(pb.LeaveRequest(node_id=self.node_id, session=self.session, reason=reason, metrics=metrics),
                        timeout=self.rpc_timeout)

    def get_work(self, give_up_after: float = 10.0, stop: Optional[threading.Event] = None) -> pb.GetWorkResponse:
        request = pb.GetWorkRequest(node_id=self.node_id, session=self.session)
        return self._retry(lambda: self.stub.GetWork(request, timeout=self.rpc_timeout), "get work", give_up_after,
                           stop)

    def report_work(self, epoch: int, index: int, samples: int, give_up_after: float = 10.0,
                    stop: Optional[threading.Event] = None) -> pb.ReportWorkResponse:
        request = pb.ReportWorkRequest(node_id=self.node_id, session=self.session, epoch=epoch, index=index,
                                       samples=samples)
        return self._retry(lambda: self.stub.ReportWork(request, timeout=self.rpc_timeout), "report work",
                           give_up_after, stop)

    def read(self, split: str, offset: int, length: int, stop: Optional[threading.Event] = None,
             give_up_after: float = 600.0) -> bytes:
        """Bytes of the corpus; waits (with backoff, up to ``give_up_after`` seconds) while the coordinator is away,
        then raises CoordinatorUnavailable."""
        out = bytearray()
        while len(out) < length:
            want = min(length - len(out), MAX_READ_BYTES)
            request = pb.ReadDataRequest(node_id=self.node_id, session=self.session, split=split,
                                         offset=offset + len(out), length=want)
            chunk = self._retry(lambda: self.stub.ReadData(request, timeout=self.rpc_timeout), "read data",
                                give_up_after, stop)
            if not chunk.data:
                break
            out += chunk.data
        return bytes(out)

    def get_checkpoint(self, on_progress=None, timeout: float = 600.0) -> Optional[bytes]:
        """The coordinator's latest checkpoint, verified against its sha256; None when it has none."""
        out, sha, total = bytearray(), "", 0
        try:
            for chunk in self.stub.GetCheckpoint(pb.GetCheckpointRequest(node_id=self.node_id, session=self.session),
                                                 timeout=timeout):
                if chunk.sha256:
                    sha, total = chunk.sha256, chunk.total
                out += chunk.data
                if on_progress is not None:
                    on_progress(len(out), total)
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.NOT_FOUND, *RETRYABLE):
                return None
            raise
        if hashlib.sha256(out).hexdigest() != sha:
            logger.warning("the coordinator's checkpoint arrived corrupt (sha256 mismatch); not used")
            return None
        return bytes(out)

    def submit_evidence(self, round_number: int, data: bytes, timeout: float = 60.0) -> pb.SubmitEvidenceResponse:
        """Upload the evidence of ``round_number`` that a heartbeat's answer asked for, in chunks."""
        first = pb.EvidenceChunk(node_id=self.node_id, session=self.session, round=round_number)
        return self.stub.SubmitEvidence(upload_chunks(first, data, pb.EvidenceChunk), timeout=timeout)

    def health(self) -> pb.SwarmHealth:
        return self.stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=self.rpc_timeout)


def upload_chunks(first, data: bytes, chunk_type):
    """A client-streamed upload: ``first`` (who and what, no bytes), then ``data`` in messages of ``chunk_type`` of
    :data:`EVIDENCE_CHUNK_BYTES` each."""
    yield first
    for at in range(0, len(data), EVIDENCE_CHUNK_BYTES):
        yield chunk_type(data=data[at:at + EVIDENCE_CHUNK_BYTES])


def _gpu_count() -> int:
    import torch

    try:
        return torch.cuda.device_count()
    except RuntimeError as e:  # a broken driver: the node still trains on its CPUs
        logger.warning("cannot count GPUs (%s); reporting none", e)
        return 0


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
