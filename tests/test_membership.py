import math

import pytest

from cotrain.coordinator.membership import (HEALTHY, LEFT, LOST, STRAGGLER, NodeView, active_nodes, assign_shards,
                                            node_state)


def view(name, last_seen=100.0, sps=10.0, loss=2.0, left=False, joined=0.0):
    return NodeView(name, name, joined, last_seen, left, sps, loss)


@pytest.mark.parametrize("node, peers, expected", [
    (view("a"), [view("a"), view("b")], HEALTHY),
    (view("a", left=True), [], LEFT),
    (view("a", last_seen=80.0), [], LOST),  # 20 s silent > 2 s x 5
    (view("a", last_seen=91.0), [], HEALTHY),  # 9 s silent < 10 s
    (view("a", sps=2.0), [view("a", sps=2.0), view("b", sps=10.0), view("c", sps=12.0)], STRAGGLER),
    (view("a", loss=math.nan), [], STRAGGLER),
])
def test_node_state(node, peers, expected):
    state, reason = node_state(100.0, node, peers, heartbeat_interval=2.0, lost_after_missed=5)
    assert state == expected, reason
    assert reason


def test_straggler_reason_says_how_much_slower():
    peers = [view("a", sps=2.0), view("b", sps=10.0), view("c", sps=12.0)]
    _, reason = node_state(100.0, peers[0], peers, 2.0, 5)
    assert "5.0x slower than the median" in reason


def test_shards_cover_the_range_without_overlap():
    shards, reason = assign_shards(["a", "b", "c"], 0, 1000)
    spans = sorted((s.start, s.end) for s in shards.values())
    assert spans[0][0] == 0 and spans[-1][1] == 1000
    assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
    assert {s.num_shards for s in shards.values()} == {3}
    assert "3 active" in reason


def test_active_nodes_excludes_lost_and_left_in_join_order():
    nodes = [view("b", joined=2.0), view("a", joined=1.0), view("c", left=True), view("d", last_seen=0.0)]
    assert [n.node_id for n in active_nodes(100.0, nodes, 2.0, 5)] == ["a", "b"]
