"""Property-based tests of the control plane: malformed, oversized and out-of-range requests get a clear status,
never a crash (UNKNOWN/INTERNAL is an unhandled exception on the server), never a hang, and the server still
answers afterwards."""

import logging
import random

import grpc
import pytest
from google.protobuf import message_factory
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cotrain.cli.local_swarm import Swarm
from cotrain.coordinator.wire import ThrottledWarning, method_handlers
from cotrain.protocol import PROTOCOL_VERSION
from cotrain.v1 import coordinator_pb2 as pb
from cotrain.v1 import coordinator_pb2_grpc as pb_grpc

from tiny_swarm import tiny_config

pytestmark = pytest.mark.swarm

ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED}
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))

text = st.text(max_size=300) | st.just("x" * 100_000)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
u32 = st.integers(min_value=0, max_value=2**32 - 1)
floats = st.floats(allow_nan=True, allow_infinity=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory, corpus_file, node_zygote):
    tmp = tmp_path_factory.mktemp("fuzz")
    cfg = tiny_config(corpus_file, coordinator={"join_rate_per_s": 0.0, "heartbeat_rate_per_s": 0.0})
    with Swarm(cfg, tmp, zygote=node_zygote) as running:
        channel = grpc.insecure_channel(running.address)
        stub = pb_grpc.CoordinatorStub(channel)
        good = stub.Join(pb.JoinRequest(token=running.token, node_name="fuzzer", protocol_version=PROTOCOL_VERSION),
                         timeout=10)
        yield stub, running, good
        channel.close()


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
@given(step=u64, loss=floats, sps=floats, sent=u64, compute=floats, forged=st.booleans(), memory=u64, rtt=floats)
def test_heartbeat(server, step, loss, sps, sent, compute, forged, memory, rtt):
    stub, _, good = server
    session = "forged" if forged else good.session
    call(stub.Heartbeat, pb.HeartbeatRequest(node_id=good.node_id, session=session, metrics=pb.NodeMetrics(
        step=step, loss=loss, samples_per_s=sps, bytes_sent=sent, compute_s=compute, memory_bytes=memory,
        heartbeat_ms=rtt)))
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


# ---- bytes that are not a message at all (issue 15, item 4) ---------------------------------------------------------
# grpc hands a request's bytes to the deserializer before the service sees them; these tests send raw bytes to every
# method of the Coordinator service as the descriptor lists them, so an RPC added later is covered too.

SERVICE = pb.DESCRIPTOR.services_by_name["Coordinator"]
CRASHES = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _bad_utf8(descriptor, depth: int = 3):
    """A message of this type whose first string field (perhaps in a sub-message) holds invalid UTF-8; None if
    the type has no string field. proto3 parsers must reject it."""
    for field in descriptor.fields:
        if field.type == field.TYPE_STRING:
            return _varint(field.number << 3 | 2) + b"\x02\xff\xfe"
    for field in descriptor.fields:
        if field.type == field.TYPE_MESSAGE and depth:
            inner = _bad_utf8(field.message_type, depth - 1)
            if inner is not None:
                return _varint(field.number << 3 | 2) + _varint(len(inner)) + inner
    return None


def _rejected(message_class, data: bytes) -> bool:
    try:
        message_class.FromString(data)
    except Exception:  # noqa: BLE001
        return True
    return False


def invalid_payloads(method, rng: random.Random, n_random: int) -> list[bytes]:
    """Bytes the parser of ``method``'s request type rejects: hand-made ones and random ones."""
    cls = message_factory.GetMessageClass(method.input_type)
    made = [b"\x08\xff",                      # field 1 varint, truncated
            b"\x08" + b"\xff" * 10 + b"\x01",  # a varint longer than 10 bytes
            b"\x0a\x7fab",                    # a length past the end
            b"\x0f", b"\x0e",                 # wire types 7 and 6 do not exist
            b"\x0c",                          # end of a group that never started
            b"\x00",                          # field number 0
            _bad_utf8(method.input_type)]
    payloads = [p for p in made if p is not None]
    assert all(_rejected(cls, p) for p in payloads), "a hand-made payload parses: fix the test"
    while len(payloads) < len(made) + n_random:
        data = rng.randbytes(rng.randint(1, 256))
        if _rejected(cls, data):  # random bytes nearly always are; the few that parse are tested below
            payloads.append(data)
    return payloads


def raw_call(channel, method, payloads: list[bytes], timeout: float = 10):
    """Send ``payloads`` (one, or in turn on a client stream) as raw bytes; -> (responses, error or None)."""
    path = f"/{SERVICE.full_name}/{method.name}"
    kind = {(False, False): channel.unary_unary, (False, True): channel.unary_stream,
            (True, False): channel.stream_unary, (True, True): channel.stream_stream}[
        method.client_streaming, method.server_streaming]
    fn = kind(path)  # no serializers: bytes in, bytes out
    request = iter(payloads) if method.client_streaming else payloads[0]
    responses = []
    try:
        result = fn(request, timeout=timeout)
        if method.server_streaming:
            for response in result:
                responses.append(response)
        else:
            responses.append(result)
    except grpc.RpcError as e:
        return responses, e
    return responses, None


def assert_invalid_argument(method, error):
    assert error is not None, f"{method.name}: malformed request accepted"
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{method.name}: {error.code()}: {error.details()}"
    assert method.input_type.full_name in error.details(), error.details()


@pytest.fixture(scope="module")
def raw_channel(server):
    channel = grpc.insecure_channel(server[1].address)
    yield channel
    channel.close()


def test_every_rpc_is_covered():
    """The descriptor is where the handlers come from: each RPC of the proto, streaming ones included."""
    names = {m.name for m in SERVICE.methods}
    assert {"Join", "Heartbeat", "HeartbeatStream", "GetCheckpoint", "GetSwarmHealth"} <= names
    assert any(m.client_streaming and m.server_streaming for m in SERVICE.methods)
    assert any(m.server_streaming and not m.client_streaming for m in SERVICE.methods)


def test_garbage_to_every_method(server, raw_channel):
    """Hundreds of malformed requests to every RPC: INVALID_ARGUMENT naming the message type, no traceback and a
    line or two in the coordinator's log, and the coordinator still answers."""
    stub, running, _ = server
    log_path = running.state_dir / "coordinator.log"
    start = log_path.stat().st_size
    rng = random.Random(15)
    sent = 0
    for method in SERVICE.methods:
        for payload in invalid_payloads(method, rng, n_random=20):
            responses, error = raw_call(raw_channel, method, [payload])
            assert not responses
            assert_invalid_argument(method, error)
            sent += 1
    assert sent >= 200
    still_answers(stub)
    new = log_path.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in new
    assert len(new.splitlines()) <= 10, new[-3000:]


def test_garbage_mid_stream(server, raw_channel):
    """HeartbeatStream answers the valid messages before a malformed one, then ends with INVALID_ARGUMENT."""
    stub, running, good = server
    method = SERVICE.methods_by_name["HeartbeatStream"]
    valid = pb.HeartbeatRequest(node_id=good.node_id, session=good.session,
                                metrics=pb.NodeMetrics(step=1)).SerializeToString()
    for garbage in (b"\x08\xff", _bad_utf8(method.input_type)):
        responses, error = raw_call(raw_channel, method, [valid, valid, garbage, valid])
        assert [pb.HeartbeatResponse.FromString(r).command for r in responses] == [pb.CONTINUE, pb.CONTINUE]
        assert_invalid_argument(method, error)
        responses, error = raw_call(raw_channel, method, [garbage])  # first message
        assert not responses
        assert_invalid_argument(method, error)
    still_answers(stub)


@FUZZ
@given(index=st.integers(min_value=0, max_value=len(SERVICE.methods) - 1), data=st.binary(max_size=300))
@example(index=0, data=b"\x0d\x00\x00\x00\x00")  # field 1 with the wrong wire type: kept as an unknown field
@example(index=0, data=b"")
def test_random_bytes(server, raw_channel, index, data):
    """Whatever the bytes, a status that says what is wrong: INVALID_ARGUMENT naming the type when they do not
    parse, and otherwise what the service says about the (odd) message, never a crash or a hang."""
    stub, _, _ = server
    method = SERVICE.methods[index]
    _, error = raw_call(raw_channel, method, [data])
    if _rejected(message_factory.GetMessageClass(method.input_type), data):
        assert_invalid_argument(method, error)
    elif error is not None:
        assert error.code() not in CRASHES, f"{method.name}: {error.code()}: {error.details()}"
        assert error.details()
    still_answers(stub)


def test_health_service_still_registered(server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    with grpc.insecure_channel(server[1].address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE.full_name):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_throttled_warning(caplog):
    """One warning per interval at most, the next one counting those in between."""
    now = [0.0]
    warning = ThrottledWarning(logging.getLogger("test.wire"), interval_s=30.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.wire"):
        logged = [warning.note("bad") for _ in range(200)]
        assert logged == [True] + [False] * 199 and len(caplog.records) == 1
        now[0] = 29.0
        assert not warning.note("bad")
        assert warning.suppressed == 200  # the ones since the first report, which the next report counts
        now[0] = 30.5
        assert warning.note("bad")
    assert len(caplog.records) == 2
    assert (warning.suppressed, warning.total) == (0, 202)


def test_handlers_need_async_methods():
    """The service runs on the event loop: a plain method is refused when the server is built, not at the first
    call; a method the servicer lacks (an RPC not written yet) still gets a handler."""
    class Sync(pb_grpc.CoordinatorServicer):
        def Join(self, request, context):
            return pb.JoinResponse()

    with pytest.raises(TypeError, match="Join"):
        method_handlers(Sync(), SERVICE)

    class Partial:
        async def Join(self, request, context):
            return pb.JoinResponse()

    assert set(method_handlers(Partial(), SERVICE)) == {m.name for m in SERVICE.methods}
