"""The virtual swarm (cotrain.averaging.simulation): the node's round functions on a modelled board. What a board
read costs a peer must stay bounded on a sharded board and grow with the swarm on one key."""

from cotrain.averaging.simulation import SimConfig, lookup_bytes, simulate


def run(peers, shards, **kw):
    return simulate(SimConfig(peers=peers, shards=shards, duration_s=20.0, step_s=0.1, inner_steps=10, **kw))


def test_a_sharded_board_reads_about_the_same_records_whatever_the_swarm_size():
    small, large = run(40, 5), run(160, 20)
    one_small, one_large = run(40, 1), run(160, 1)
    # one key: every read is the whole swarm; shards of ~8: a read stays near 8 records a round its records live
    assert one_large.records_per_read > 3 * one_small.records_per_read
    assert large.records_per_read < 1.5 * small.records_per_read
    assert large.records_per_read < one_large.records_per_read / 4
    # what the board costs a node: grows 4x with the swarm on one key, only by the lookups' log N with shards
    assert one_large.dht_bytes_per_node_min > 3 * one_small.dht_bytes_per_node_min
    assert large.dht_bytes_per_node_min < 1.5 * small.dht_bytes_per_node_min
    assert large.busiest_node_bytes_min < one_large.busiest_node_bytes_min / 4


def test_virtual_peers_form_groups_and_move_on_together():
    result = run(60, 6, group=4)
    assert result.groups > 0 and 2 <= result.group_size <= 5, result
    assert result.rounds_per_min > 0 and result.lead_round >= 2, result


def test_a_simulation_is_repeatable_and_lookups_grow_with_log_n():
    assert run(30, 3, seed=5) == run(30, 3, seed=5)
    visit = lookup_bytes(3) // 2  # a swarm of 3: the 2 others are all a lookup visits
    assert lookup_bytes(3) == 2 * visit and lookup_bytes(4) == 3 * visit
    # past the search's beam, a lookup grows by one visit every time the swarm doubles: 5 more from 32 to 1024
    assert lookup_bytes(1024) - lookup_bytes(32) == 5 * visit
