"""Property-based tests of the control plane: malformed, oversized and out-of-range requests get a clear status,
never a crash (UNKNOWN/INTERNAL is an unhandled exception on the server), never a hang, and the server still
answers afterwards."""

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cotrain.protocol import PROTOCOL_VERSION
from cotrain.v1 import coordinator_pb2 as pb
from cotrain.v1 import coordinator_pb2_grpc as pb_grpc

from conftest import RunningCoordinator, tiny_config

pytestmark = pytest.mark.swarm

ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED}
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))

text = st.text(max_size=300) | st.just("x" * 100_000)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
u32 = st.integers(min_value=0, max_value=2**32 - 1)
floats = st.floats(allow_nan=True, allow_infinity=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory, corpus_file):
    tmp = tmp_path_factory.mktemp("fuzz")
    running = RunningCoordinator(tmp, tiny_config(corpus_file, coordinator={"join_rate_per_s": 0.0,
                                                                             "heartbeat_rate_per_s": 0.0}))
    channel = grpc.insecure_channel(running.address)
    stub = pb_grpc.CoordinatorStub(channel)
    good = stub.Join(pb.JoinRequest(token=running.token, node_name="fuzzer", protocol_version=PROTOCOL_VERSION),
                     timeout=10)
    yield stub, running, good
    channel.close()
    running.stop()


def call(fn, request):
    try:
        result = fn(request, timeout=10)
        if hasattr(result, "__iter__") and not hasattr(result, "ListFields"):
            list(result)  # drain a stream
    except grpc.RpcError as e:
        assert e.code() in ALLOWED, f"{e.code()}: {e.details()}"
        assert e.details()


def still_answers(stub):
    assert stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=10).run_id


@FUZZ
@given(token=text, name=text, version=u32, node_id=text, cpus=u32, memory=u64)
def test_join(server, token, name, version, node_id, cpus, memory):
    stub, running, _ = server
    call(stub.Join, pb.JoinRequest(token=token, node_name=name, protocol_version=version, node_id=node_id,
                                   capabilities=pb.Capabilities(cpus=cpus, memory_bytes=memory)))
    call(stub.Join, pb.JoinRequest(token=running.token, node_name=name, protocol_version=version, node_id=node_id))
    still_answers(stub)


@FUZZ
@given(step=u64, loss=floats, sps=floats, sent=u64, compute=floats, forged=st.booleans())
def test_heartbeat(server, step, loss, sps, sent, compute, forged):
    stub, _, good = server
    session = "forged" if forged else good.session
    call(stub.Heartbeat, pb.HeartbeatRequest(node_id=good.node_id, session=session, metrics=pb.NodeMetrics(
        step=step, loss=loss, samples_per_s=sps, bytes_sent=sent, compute_s=compute)))
    still_answers(stub)


@FUZZ
@given(split=text, offset=u64, length=u32)
def test_read_data(server, split, offset, length):
    stub, _, good = server
    call(stub.ReadData, pb.ReadDataRequest(node_id=good.node_id, session=good.session, split=split, offset=offset,
                                           length=length))
    call(stub.ReadData, pb.ReadDataRequest(node_id=good.node_id, session=good.session, split="train",
                                           offset=offset, length=length))
    still_answers(stub)


@FUZZ
@given(node_id=text, session=text, reason=text)
def test_leave_and_checkpoint(server, node_id, session, reason):
    stub, _, _ = server
    call(stub.Leave, pb.LeaveRequest(node_id=node_id, session=session, reason=reason))
    call(stub.GetCheckpoint, pb.GetCheckpointRequest(node_id=node_id, session=session))
    still_answers(stub)
