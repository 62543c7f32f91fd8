import math

import pytest

from cotrain.coordinator.membership import (HEALTHY, LEFT, LOST, STRAGGLER, NodeView, active_nodes, nodes_to_forget,
                                            node_state, swarm_alerts)


def view(name, last_seen=100.0, sps=10.0, loss=2.0, left=False, joined=0.0, step=10, partial=0, rounds=0):
    return NodeView(name, name, joined, last_seen, left, sps, loss, step, partial, rounds)


@pytest.mark.parametrize("node, peers, expected", [
    (view("a"), [view("a"), view("b")], HEALTHY),
    (view("a", left=True), [], LEFT),
    (view("a", last_seen=80.0), [], LOST),  # 20 s silent > 2 s x 5
    (view("a", last_seen=91.0), [], HEALTHY),  # 9 s silent < 10 s
    (view("a", sps=2.0), [view("a", sps=2.0), view("b", sps=10.0), view("c", sps=12.0)], STRAGGLER),
    (view("a", loss=math.nan), [], STRAGGLER),
    (view("a", loss=math.nan, step=0), [], HEALTHY),  # no loss reported yet
])
def test_node_state(node, peers, expected):
    state, reason = node_state(100.0, node, peers, heartbeat_interval=2.0, lost_after_missed=5)
    assert state == expected, reason
    assert reason


def test_straggler_reason_says_how_much_slower():
    peers = [view("a", sps=2.0), view("b", sps=10.0), view("c", sps=12.0)]
    _, reason = node_state(100.0, peers[0], peers, 2.0, 5)
    assert "5.0x slower than the median" in reason


def test_active_nodes_excludes_lost_and_left_in_join_order():
    nodes = [view("b", joined=2.0), view("a", joined=1.0), view("c", left=True), view("d", last_seen=0.0)]
    assert [n.node_id for n in active_nodes(100.0, nodes, 2.0, 5)] == ["a", "b"]


def test_alerts_in_words():
    nodes = [view("bob", sps=3.0), view("alice", sps=10.0), view("dave", sps=9.3), view("carol", loss=math.nan),
             view("erin", last_seen=0.0), view("frank", partial=1, rounds=4)]
    rows = [(n, *node_state(100.0, n, nodes, 2.0, 5)) for n in nodes]
    alerts = swarm_alerts(rows)
    assert "bob: 3.3x slower than the median: straggler" in alerts  # median of 3, 10, 9.3, 10, 10, 10 is 10
    assert "carol: loss is nan, updates dropped" in alerts
    assert any(a.startswith("erin: lost") for a in alerts)
    assert "frank: 1 of 4 rounds averaged without every peer's contribution" in alerts
    assert not any(a.startswith(("alice", "dave")) for a in alerts)


def test_history_view_builds_the_dashboard_curves():
    from cotrain.coordinator.store import EvalRow, HistoryRow
    from cotrain.coordinator.web import history_view

    rows = [HistoryRow(100.0, "a", {"loss": 3.0, "samples_per_s": 10.0, "bytes_sent": 5, "samples_local": 50}),
            HistoryRow(101.0, "b", {"loss": float("nan"), "samples_per_s": 20.0, "bytes_sent": 7,
                                    "samples_local": 80, "rounds_completed": 2}),
            HistoryRow(112.0, "a", {"loss": 2.5, "samples_per_s": 12.0, "bytes_sent": 9, "samples_local": 90})]
    evals = [EvalRow(105.0, 1, 2.9, float("nan"), {})]
    view_ = history_view(rows, evals, {"a": "alice", "b": "bob"}, bucket_s=10.0)
    assert [b["online"] for b in view_["buckets"]] == [2, 1]
    assert view_["buckets"][0]["samples_per_s"] == 30.0
    assert view_["buckets"][1]["bytes_sent"] == 9 + 7  # each node's latest counter, summed
    assert [c["name"] for c in view_["leaderboard"]] == ["alice", "bob"]
    assert view_["leaderboard"][0]["online_s"] == 12.0
    assert view_["points"][1]["loss"] is None  # NaN is not JSON
    assert view_["evals"] == [{"t": 105.0, "round": 1, "val_loss": 2.9, "val_bpc": None, "samples": None, "lr": None}]
    assert "verified_samples" not in view_["leaderboard"][0]  # no verification: nothing is called verified
    # with verification, a suspended node's samples count for nothing and the board ranks by what is verified
    checked = history_view(rows, evals, {"a": "alice", "b": "bob"}, bucket_s=10.0, reputations={"a": 0.0})
    assert [(c["name"], c["verified_samples"]) for c in checked["leaderboard"]] == [("bob", 80), ("alice", 0)]


@pytest.mark.parametrize("node, since, forgotten", [
    (view("a", left=True, last_seen=0.0), 0.0, True),  # left 5,000 s ago
    (view("a", last_seen=0.0), 0.0, True),  # silent 5,000 s: lost, and long enough
    (view("a", left=True, last_seen=2000.0), 0.0, False),  # left 3,000 s ago: kept for now
    (view("a", last_seen=4990.0), 0.0, False),  # healthy
    (view("a", last_seen=0.0), 3000.0, False),  # the coordinator started 2,000 s ago: the node may still come back
])
def test_nodes_to_forget(node, since, forgotten):
    decided = nodes_to_forget(5000.0, [node], 2.0, 5, forget_after=3600.0, since=since)
    assert [n for n, _ in decided] == (["a"] if forgotten else [])
    assert all("forget_after_s 3600" in why for _, why in decided)


def test_a_forgotten_node_leaves_the_health_view_and_its_session_no_longer_works(tmp_path):
    """The service as the server drives it, with a fake clock: nodes gone longer than forget_after_s are dropped
    at the tick; a node that comes back with its old session is told to join again."""
    import asyncio

    import grpc

    from cotrain.coordinator.admission import Issuer, load_or_create_key
    from cotrain.coordinator.reachability import Prober
    from cotrain.coordinator.service import CoordinatorService, RunInfo, SwarmSummary
    from cotrain.coordinator.store import NodeRecord, Store, hash_secret
    from cotrain.v1 import coordinator_pb2 as pb

    class Aborted(Exception):
        pass

    class Context:
        def peer(self):
            return "ipv4:127.0.0.1:5000"

        async def abort(self, code, details):
            raise Aborted(code, details)

    now = [1000.0]
    store = Store(tmp_path)
    for name, left in (("leaver", True), ("silent", False), ("alive", False)):
        store.save_node(NodeRecord(name[0] * 32, name, "t", hash_secret(name), joined=0.0, last_seen=1000.0,
                                   left=left))
    issuer = Issuer(load_or_create_key(tmp_path), "run", 600.0, store.get_meta, store.set_meta, lambda: now[0])
    run = RunInfo("run", "", None, heartbeat_interval=1.0, lost_after_missed=5, initial_peers=list,
                  forget_after_s=3600.0)
    service = CoordinatorService(store, run, SwarmSummary(), issuer, Prober(), clock=lambda: now[0])

    def heartbeat(name):
        request = pb.HeartbeatRequest(node_id=name[0] * 32, session=name, metrics=pb.NodeMetrics())
        return asyncio.run(service.Heartbeat(request, Context()))

    try:
        for t in (2000.0, 4000.0, 4500.0):
            now[0] = t
            assert heartbeat("alive").command == pb.CONTINUE
            service.forget_departed()
        assert {n.node_name for n in service.health().nodes} == {"leaver", "silent", "alive"}  # 3,500 s: kept
        now[0] = 4700.0
        service.forget_departed()
        assert {n.node_name for n in service.health().nodes} == {"alive"}
        with pytest.raises(Aborted) as refused:
            heartbeat("silent")
        assert refused.value.args[0] == grpc.StatusCode.UNAUTHENTICATED
        assert {n.name for n in store.load_nodes()} == {"leaver", "silent", "alive"}  # the store keeps the records
    finally:
        store.close()
