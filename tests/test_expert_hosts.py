"""Expert hosts at a real coordinator (gRPC, a real DHT peer the coordinator dials): hosts that report are given the
run's experts, every expert one host; a trainer reads each expert's host peer; a host that leaves has its experts
moved at the next report; a host behind NAT (client mode), a run without experts and oversized reports are refused
with the reason."""

import grpc
import pytest

from cotrain.averaging import start_dht
from cotrain.averaging.dht import load_record_key, visible_maddrs
from cotrain.cli.local_swarm import Swarm
from cotrain.client import CoordinatorClient

from tiny_swarm import tiny_config

pytestmark = pytest.mark.swarm


def member(coordinator, name: str, dht=None, client_mode: bool = False) -> CoordinatorClient:
    client = CoordinatorClient(coordinator.address, insecure=True)
    client.join(coordinator.token, name)
    if dht is not None:
        client.register_peer(str(dht.peer_id), visible_maddrs(dht), load_record_key(None).get_public_key().to_bytes(),
                             client_mode=client_mode)
    return client


def test_hosts_get_the_experts_and_trainers_find_them(tmp_path, corpus_file, node_zygote):
    cfg = tiny_config(corpus_file, model={"kind": "moe_lstm"}, moe={"grid": [2, 2], "expert_hidden": 16, "k": 2})
    dhts, clients = [], []
    with Swarm(cfg, tmp_path, zygote=node_zygote) as coordinator:
        try:
            dhts = [start_dht(coordinator.info["dht"], identity_path=str(tmp_path / f"{n}.key")) for n in "abc"]
            a, b = member(coordinator, "host-a", dhts[0]), member(coordinator, "host-b", dhts[1])
            nat = member(coordinator, "host-nat", dhts[2], client_mode=True)
            trainer = member(coordinator, "trainer")
            clients = [a, b, nat, trainer]
            held_a, held_b = a.report_experts(3, []).uids, b.report_experts(3, []).uids
            uids = [f"moe0.{i}.{j}" for i in range(2) for j in range(2)]
            assert sorted([*held_a, *held_b]) == uids  # every expert one host
            directory = trainer.experts()
            assert directory == {**{u: str(dhts[0].peer_id) for u in held_a}, **{u: str(dhts[1].peer_id) for u in held_b}}

            with pytest.raises(grpc.RpcError) as refused:
                nat.report_experts(3, [])
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "dial" in refused.value.details()
            with pytest.raises(grpc.RpcError) as refused:
                a.report_experts(3, ["x" * 200])
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "holds" in refused.value.details()

            b.leave("done")
            answer = a.report_experts(3, list(held_a))
            assert set(held_a) <= set(answer.uids) and len(answer.uids) == 3
            assert "1 of 4 experts have no host" in answer.reason
            assert set(trainer.experts().values()) == {str(dhts[0].peer_id)}
        finally:
            for c in clients:
                c.close()
            for d in dhts:
                d.shutdown()


def test_a_run_without_experts_says_so(coordinator):
    client = member(coordinator, "trainer")
    try:
        with pytest.raises(grpc.RpcError) as refused:
            client.experts()
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "moe_lstm" in refused.value.details()
    finally:
        client.close()
