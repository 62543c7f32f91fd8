"""The coordinator's gRPC service, called for real over 127.0.0.1."""

import json
import subprocess
import sys

import grpc
import pytest

from cotrain.cli.local_swarm import Swarm
from cotrain.coordinator.store import Store
from cotrain.exit_codes import ExitCode
from cotrain.protocol import PROTOCOL_VERSION
from cotrain.v1 import coordinator_pb2 as pb
from cotrain.v1 import coordinator_pb2_grpc as pb_grpc
from tiny_swarm import tiny_config

pytestmark = pytest.mark.swarm


@pytest.fixture
def stub(coordinator):
    channel = grpc.insecure_channel(coordinator.address)
    yield pb_grpc.CoordinatorStub(channel)
    channel.close()


def join(stub, token, name="n1", version=PROTOCOL_VERSION, node_id=""):
    return stub.Join(pb.JoinRequest(token=token, node_name=name, protocol_version=version, node_id=node_id,
                                    capabilities=pb.Capabilities(cpus=2)), timeout=10)


def code_of(call):
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def test_wrong_or_missing_token_is_unauthenticated(stub):
    assert code_of(lambda: join(stub, "ct_wrong"))[0] == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: join(stub, ""))[0] == grpc.StatusCode.UNAUTHENTICATED


def test_unsupported_protocol_names_supported_versions(stub, coordinator):
    code, details = code_of(lambda: join(stub, coordinator.token, version=99))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "99" in details and str(PROTOCOL_VERSION) in details


def test_bad_name_is_invalid_argument(stub, coordinator):
    code, details = code_of(lambda: join(stub, coordinator.token, name=""))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "node_name" in details


def test_join_heartbeat_read_leave(stub, coordinator):
    r = join(stub, coordinator.token)
    assert len(r.node_id) == 32 and r.session
    assert r.run.run_id.startswith("test-") and "[model]" in r.run.config_toml
    assert r.initial_peers and all(p.startswith("/ip4/127.0.0.1/tcp/") for p in r.initial_peers)

    hb = stub.Heartbeat(pb.HeartbeatRequest(node_id=r.node_id, session=r.session,
                                            metrics=pb.NodeMetrics(step=5, loss=2.5, samples_per_s=10.0)), timeout=10)
    assert hb.command == pb.CONTINUE
    bad = code_of(lambda: stub.Heartbeat(pb.HeartbeatRequest(node_id=r.node_id, session="forged"), timeout=10))
    assert bad[0] == grpc.StatusCode.UNAUTHENTICATED

    chunk = stub.ReadData(pb.ReadDataRequest(node_id=r.node_id, session=r.session, split="train", offset=0,
                                             length=100), timeout=10)
    assert len(chunk.data) == 100
    corpus_head = coordinator.cfg.data.source
    assert chunk.data == open(corpus_head, "rb").read(100)
    text = open(corpus_head, "rb").read(r.run.train_bytes)  # the corpus is small: the counts cover all of it
    assert list(r.run.byte_counts) == [text.count(bytes([b])) for b in range(256)]
    code, details = code_of(lambda: stub.ReadData(pb.ReadDataRequest(
        node_id=r.node_id, session=r.session, split="test", offset=0, length=10), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "split" in details

    health = stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=10)
    row = {n.node_id: n for n in health.nodes}[r.node_id]
    assert row.state == "healthy" and row.metrics.step == 5 and health.totals.nodes_online == 1

    stub.Leave(pb.LeaveRequest(node_id=r.node_id, session=r.session, reason="test"), timeout=10)
    health = stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=10)
    assert {n.node_id: n.state for n in health.nodes}[r.node_id] == "left"
    assert health.totals.nodes_online == 0


def test_heartbeat_stream_answers_each_heartbeat_and_ends_on_a_bad_session(stub, coordinator):
    r = join(stub, coordinator.token, "streamer")
    requests = [pb.HeartbeatRequest(node_id=r.node_id, session=r.session, metrics=pb.NodeMetrics(step=s))
                for s in (1, 2, 3)]
    answers = list(stub.HeartbeatStream(iter(requests), timeout=10))
    assert [a.command for a in answers] == [pb.CONTINUE] * 3
    health = stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=10)
    assert {n.node_name: n.metrics.step for n in health.nodes}["streamer"] == 3
    forged = iter(requests[:1] + [pb.HeartbeatRequest(node_id=r.node_id, session="forged")])
    code, details = code_of(lambda: list(stub.HeartbeatStream(forged, timeout=10)))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "session" in details


def test_node_client_heartbeats_over_a_stream_and_reopens_it(coordinator):
    from cotrain.client import CoordinatorClient

    with CoordinatorClient(coordinator.address, insecure=True) as client:
        client.join(coordinator.token, "client")
        for step in range(1, 4):
            assert client.heartbeat(pb.NodeMetrics(step=step)).command == pb.CONTINUE
        client._heartbeats.close()  # the stream breaks (as when the coordinator restarts)
        with pytest.raises(grpc.RpcError):
            client.heartbeat(pb.NodeMetrics(step=4))
        assert client.heartbeat(pb.NodeMetrics(step=5)).command == pb.CONTINUE  # a new stream
        row = {n.node_name: n for n in client.health().nodes}["client"]
        assert row.metrics.step == 5


def work(stub, node):
    return stub.GetWork(pb.GetWorkRequest(node_id=node.node_id, session=node.session), timeout=10)


def report(stub, node, unit, samples=8):
    return stub.ReportWork(pb.ReportWorkRequest(node_id=node.node_id, session=node.session, epoch=unit.epoch,
                                                index=unit.index, samples=samples), timeout=10)


def test_work_units_are_handed_out_once_and_rejoin_keeps_identity_and_units(stub, coordinator):
    a = join(stub, coordinator.token, "a")
    b = join(stub, coordinator.token, "b")
    ua, ub = work(stub, a).unit, work(stub, b).unit
    assert (ua.epoch, ua.index) == (0, 0) and (ub.epoch, ub.index) == (0, 1)
    assert ua.end <= ub.start and ua.start < ua.end and ua.deadline_unix > 0
    assert work(stub, a).unit == ua  # asking again: the same unit
    again = join(stub, coordinator.token, "a", node_id=a.node_id)
    assert again.node_id == a.node_id and again.session != a.session
    assert work(stub, again).unit == ua  # a node that comes back keeps its unit

    done = report(stub, again, ua)
    assert done.accepted and "done" in done.reason
    twice = report(stub, again, ua)
    assert not twice.accepted and "already done" in twice.reason
    code, details = code_of(lambda: stub.ReportWork(pb.ReportWorkRequest(
        node_id=b.node_id, session=b.session, epoch=0, index=10**6), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "index" in details

    health = stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=10)
    t = health.totals
    assert t.epoch == 0 and t.units_done == 1 and t.units_in_progress == 1
    assert t.units_pending == t.units_total - 2 > 0
    assert {n.node_name: list(n.units) for n in health.nodes}["b"] == ["0/1"]

    stub.Leave(pb.LeaveRequest(node_id=b.node_id, session=b.session, reason="test"), timeout=10)
    t = stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=10).totals
    assert t.units_in_progress == 0 and t.units_reissued == 1 and "0/1" in t.scheduling_reason
    assert (work(stub, again).unit.epoch, work(stub, again).unit.index) == (0, 1)  # b's unit, reissued


def test_a_silent_nodes_unit_is_reclaimed_by_the_coordinator_alone(tmp_path, corpus_file, node_zygote):
    """No GetWork, no Leave: the coordinator's periodic tick hands a lost node's unit back (the health view that
    watches it only reads)."""
    from cotrain.cli.launch import wait_for

    running = Swarm(tiny_config(corpus_file, coordinator={"lost_after_missed": 2}), tmp_path,
                    zygote=node_zygote).start()
    channel = grpc.insecure_channel(running.address)
    try:
        stub = pb_grpc.CoordinatorStub(channel)
        silent = join(stub, running.token, "silent")
        unit = work(stub, silent).unit
        assert {n.node_name: list(n.units) for n in stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=10).nodes
                } == {"silent": [f"{unit.epoch}/{unit.index}"]}

        def reclaimed():
            t = stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=10).totals
            return t.units_reissued == 1 and t.units_in_progress == 0

        wait_for(reclaimed, 60, what="the coordinator to reclaim the silent node's unit", procs=[running.proc])
        health = stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=10)
        assert {n.node_name: (n.state, list(n.units)) for n in health.nodes} == {"silent": ("lost", [])}
    finally:
        channel.close()
        running.close()


def test_revoked_token_cannot_join(stub, coordinator):
    store = Store(coordinator.state_dir)
    token = store.create_token("temporary")
    assert join(stub, token, "x").node_id
    store.revoke_token("temporary")
    code, details = code_of(lambda: join(stub, token, "x"))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "revoked" in details


def test_swarm_status_json_cli(stub, coordinator):
    join(stub, coordinator.token, "watched")
    out = subprocess.run([sys.executable, "-m", "cotrain.cli", "swarm", "status", coordinator.address, "--insecure",
                          "--format", "json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    health = json.loads(out.stdout)
    assert [n["node_name"] for n in health["nodes"]] == ["watched"]
    assert health["totals"]["nodes_online"] == 1


def test_node_with_bad_token_exits_with_its_code(coordinator, tmp_path):
    out = subprocess.run([sys.executable, "-m", "cotrain.cli", "node", "join", coordinator.address, "--token", "ct_bad",
                          "--insecure", "--state-dir", str(tmp_path / "n")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == ExitCode.UNAUTHENTICATED
    assert "token" in out.stderr and "Traceback" not in out.stderr


def test_restarted_coordinator_resumes_its_members(coordinator):
    channel = grpc.insecure_channel(coordinator.address)
    stub = pb_grpc.CoordinatorStub(channel)
    r = join(stub, coordinator.token, "survivor")
    run_id = r.run.run_id
    channel.close()
    assert coordinator.stop_coordinator() == 0

    from cotrain.cli.launch import start_coordinator

    coordinator.proc, coordinator.address = start_coordinator(coordinator.state_dir, coordinator.config_path,
                                                              zygote=coordinator.zygote)
    channel = grpc.insecure_channel(coordinator.address)
    stub = pb_grpc.CoordinatorStub(channel)
    try:
        hb = stub.Heartbeat(pb.HeartbeatRequest(node_id=r.node_id, session=r.session,
                                                metrics=pb.NodeMetrics(step=9)), timeout=10)  # the old session works
        assert hb.command == pb.CONTINUE
        health = stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=10)
        assert health.run_id == run_id
        assert [(n.node_name, n.metrics.step) for n in health.nodes] == [("survivor", 9)]
        # the coordinator vouches with the same key: credentials it issued before the restart stay valid
        assert join(stub, coordinator.token, "later").coordinator_public_key == r.coordinator_public_key
    finally:
        channel.close()


def test_join_is_rate_limited_per_address(stub, coordinator):
    codes = []
    for i in range(40):
        try:
            join(stub, coordinator.token, f"flood-{i}")
            codes.append("ok")
        except grpc.RpcError as e:
            codes.append(e.code())
            assert e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or "rate limit" in e.details()
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
    assert codes[:10] == ["ok"] * 10  # the burst goes through


def test_a_token_admits_at_most_its_node_limit(stub, coordinator):
    token = Store(coordinator.state_dir).create_token("one-volunteer", max_nodes=1)
    first = join(stub, token, "first")
    code, details = code_of(lambda: join(stub, token, "sybil"))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "token" in details
    again = join(stub, token, "first", node_id=first.node_id)  # the same node comes back
    assert again.node_id == first.node_id
    stub.Leave(pb.LeaveRequest(node_id=again.node_id, session=again.session, reason="done"), timeout=10)
    assert join(stub, token, "second").node_id != first.node_id
    assert join(stub, coordinator.token, "other-token").node_id  # other tokens are not counted


PEER_ID = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def register(stub, joined, peer_id=PEER_ID, client_mode=True, record_key=b"rsa-key"):
    return stub.RegisterPeer(pb.RegisterPeerRequest(node_id=joined.node_id, session=joined.session, peer_id=peer_id,
                                                    maddrs=["/ip4/127.0.0.1/tcp/1"], record_public_key=record_key,
                                                    client_mode=client_mode), timeout=30)


def test_register_peer_issues_a_credential_and_revocation_drains_the_node(stub, coordinator):
    from cotrain.averaging.admission import Admission, public_key_from_bytes

    store = Store(coordinator.state_dir)
    token = store.create_token("soon-revoked")
    joined = join(stub, token, "member")
    reply = register(stub, joined)
    assert reply.reachability == "dial-out only"
    gate = Admission(joined.run.run_id, public_key_from_bytes(joined.coordinator_public_key))
    verdict = gate.verify(reply.credential, PEER_ID, record_public_key=b"rsa-key")
    assert verdict.ok and verdict.node_id == joined.node_id
    assert not gate.verify(reply.credential, "QmZMxNdpMkewiVZLMRxaNxUeZpDUb34pWjZ1kZvsd16Zic").ok
    # nothing listens at the address it announces: the coordinator's dial fails, the node is told to dial out only
    assert register(stub, joined, client_mode=False).reachability == "dial-out only"
    health = stub.GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=10)
    assert [n.reachability for n in health.nodes if n.node_name == "member"] == ["dial-out only"]

    store.revoke_token("soon-revoked")

    def drained():
        hb = stub.Heartbeat(pb.HeartbeatRequest(node_id=joined.node_id, session=joined.session,
                                                metrics=pb.NodeMetrics(step=1)), timeout=10)
        return hb if hb.command == pb.DRAIN else None

    from cotrain.cli.launch import wait_for

    hb = wait_for(drained, 30, what="the revocation to reach the heartbeat")
    assert gate.apply_revocations(hb.revocations) and joined.node_id in gate.revoked
    assert not gate.verify(reply.credential, PEER_ID).ok
    assert code_of(lambda: register(stub, joined))[0] == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("field, change", [("peer_id", dict(peer_id="not a peer id")),
                                           ("maddrs", dict(maddrs=["garbage"])),
                                           ("record_public_key", dict(record_public_key=b""))])
def test_register_peer_names_a_bad_field(stub, coordinator, field, change):
    joined = join(stub, coordinator.token, "careless")
    request = pb.RegisterPeerRequest(node_id=joined.node_id, session=joined.session, peer_id=PEER_ID,
                                     maddrs=["/ip4/127.0.0.1/tcp/1"], record_public_key=b"k", client_mode=True)
    for key, value in change.items():
        if key == "maddrs":
            del request.maddrs[:]
            request.maddrs.extend(value)
        else:
            setattr(request, key, value)
    code, details = code_of(lambda: stub.RegisterPeer(request, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details
