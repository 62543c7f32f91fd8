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


@pytest.fixture(scope="module")
def moe_coordinator(tmp_path_factory, corpus_file, node_zygote):
    """One coordinator of a run with a 2x2 grid of experts for this module's tests (each test's hosts and trainers
    are its own members)."""
    cfg = tiny_config(corpus_file, model={"kind": "moe_lstm"}, moe={"grid": [2, 2], "expert_hidden": 16, "k": 2})
    with Swarm(cfg, tmp_path_factory.mktemp("moe"), zygote=node_zygote) as coordinator:
        yield coordinator, cfg


def member(coordinator, name: str, dht=None, client_mode: bool = False) -> CoordinatorClient:
    client = CoordinatorClient(coordinator.address, insecure=True)
    client.join(coordinator.token, name)
    if dht is not None:
        client.register_peer(str(dht.peer_id), visible_maddrs(dht), load_record_key(None).get_public_key().to_bytes(),
                             client_mode=client_mode)
    return client


def test_hosts_get_the_experts_and_trainers_find_them(tmp_path, moe_coordinator):
    coordinator, _ = moe_coordinator
    dhts, clients = [], []
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
        a.leave("done")  # the module's next test starts with no host
        assert trainer.experts() == {}
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


def test_a_trainer_trains_on_expert_hosts_and_goes_on_when_a_host_is_killed(tmp_path, moe_coordinator):
    """Two `cotrain expert serve` processes, as a volunteer starts them, share the grid, and a `cotrain node join`
    trainer steps on their experts (a step needs an answer for every chunk: k_min = 1), as the coordinator's
    evaluation does; a member's client calls every expert; one host is killed (SIGKILL: no goodbye), and within the pool's 15 s and a report its experts are served
    by the other, while the trainer steps on."""
    import json
    import math
    import os
    import signal

    import torch
    from hivemind.p2p import PeerID

    from cotrain.averaging import Admission
    from cotrain.averaging.admission import public_key_from_bytes
    from cotrain.cli.launch import start_expert_host, stop_all, wait_for
    from cotrain.moe.host import RemoteExperts, expert_namespace

    coordinator, cfg = moe_coordinator
    hosts, dht, member_client, remote, survivor, logs, node = [], None, None, None, None, [], None
    try:
        for name in ("a", "b"):  # forked from the module's zygote, as cotrain demo --moe starts them
            hosts.append(start_expert_host(coordinator.address, coordinator.token, f"host-{name}",
                                           tmp_path / f"host-{name}", 4, extra=["--checkpoint-every", "1"],
                                           zygote=coordinator.zygote))
        node = coordinator.start_node("trainer", state_dir=tmp_path / "trainer", extra=["--threads", "1"])

        def steps() -> int:
            try:
                return json.loads((tmp_path / "trainer" / "status.json").read_text())["step"]
            except (OSError, ValueError, KeyError):
                return 0

        dht = start_dht(coordinator.info["dht"], identity_path=str(tmp_path / "member.key"))
        member_client = CoordinatorClient(coordinator.address, insecure=True)
        joined = member_client.join(coordinator.token, "member")
        reply = member_client.register_peer(str(dht.peer_id), visible_maddrs(dht),
                                            load_record_key(None).get_public_key().to_bytes(), client_mode=True)
        admission = Admission(joined.run.run_id, public_key_from_bytes(joined.coordinator_public_key),
                              enabled=cfg.coordinator.data_plane_auth)
        admission.set_credential(reply.credential)

        def hosted() -> dict:
            d = member_client.experts()
            return d if len(d) == 4 else {}

        wait_for(hosted, 120, interval=1.0, what="the hosts to hold the 4 experts")
        directory = hosted()
        uids = sorted(directory)
        remote = RemoteExperts(dht, expert_namespace(joined.run.run_id), admission,
                               {i: (u, PeerID.from_base58(directory[u])) for i, u in enumerate(uids)})
        x = torch.randn(2, 3, cfg.model.hidden_size)

        def every_expert_answers() -> bool:  # a host serves what it was told at its report, a moment after
            remote._down_until.clear()  # the directory shows it: ask again at once, not after down_s
            return all(y is not None and y.shape == x.shape for y in remote({i: x for i in range(4)}).values())

        wait_for(every_expert_answers, 30, interval=1.0, what="every expert to answer")
        # a step is taken only when the experts answered: the trainer's model holds none of them
        wait_for(lambda: steps() >= 15, 120, interval=0.5, what="the trainer to step on the hosts' experts",
                 procs=[node])
        # the coordinator evaluates the shared model with the experts on their hosts too
        wait_for(lambda: math.isfinite(coordinator.health().totals.val_bpc), 60, interval=0.5,
                 what="the coordinator to evaluate the mixture", procs=[node])
        # the hosts' reports show the calls their experts answered (every 3 s)
        wait_for(lambda: sum(x.backward for h in coordinator.health().experts.hosts for x in h.served) > 0, 30,
                 interval=0.5, what="the hosts to report the calls they answered")

        # kill a host that holds experts (the first to report may hold them all: moving an expert costs, so
        # the plan keeps experts where they are); each host's log names its peer
        logs = [host.log() for host in hosts]
        holder = next(i for i, text in enumerate(logs) if "holding" in text)
        killed = {p for p in directory.values() if p[-8:] in logs[holder]}
        survivor = hosts[1 - holder]
        os.kill(hosts[holder].pid, signal.SIGKILL)
        wait_for(lambda: not hosts[holder].alive(), 10, interval=0.1, what="the killed host to end")
        at_kill = steps()
        wait_for(lambda: hosted() and not set(hosted().values()) & killed, 60, interval=1.0,
                 what="the killed host's experts to move")
        moved = hosted()
        assert survivor.alive()
        # the survivor took the moved experts from their checkpoints at the coordinator, not new
        killed_uids = {u for u, p in directory.items() if p in killed}

        def restored() -> bool:
            loads = {x.uid: x for h in coordinator.health().experts.hosts for x in h.served}
            return killed_uids <= set(loads) and any(loads[u].started_from > 0 for u in killed_uids)

        wait_for(restored, 30, interval=0.5, what="the survivor to report the moved experts from their checkpoints")
        remote.set_hosts({i: (u, PeerID.from_base58(moved[u])) for i, u in enumerate(uids)})
        wait_for(every_expert_answers, 30, interval=1.0, what="every expert to answer from the survivor")
        wait_for(lambda: steps() >= at_kill + 15, 90, interval=0.5, what="the trainer to step on after the kill",
                 procs=[node])
        assert node.stop(30) == 0, node.log()[-3000:]
        assert survivor.stop(30) == 0, survivor.log()[-3000:]  # it checkpoints its experts and leaves
    finally:
        stop_all(hosts, 30)
        if node is not None and node.alive():
            node.stop(30)
        if remote is not None:
            remote.shutdown()
        if member_client is not None:
            member_client.close()
        if dht is not None:
            dht.shutdown()
