"""Which host holds which expert (cotrain.moe.assignment.plan_experts), as a table: every expert one host, what
hosts hold kept, a lost host's experts moved to the hosts with the most room, duplicates and overflow given up."""

import pytest

from cotrain.moe.assignment import Host, plan_experts

UIDS = [f"ffn.{i}" for i in range(6)]


@pytest.mark.parametrize("hosts, holds, unhosted, moved, words", [
    # a fresh run: the experts spread over the hosts by room
    ([Host("a", 3), Host("b", 3)], {"a": UIDS[0::2], "b": UIDS[1::2]}, [], UIDS, "given a host"),
    # what hosts hold stays where it is
    ([Host("a", 3, tuple(UIDS[:3])), Host("b", 3, tuple(UIDS[3:]))], {"a": UIDS[:3], "b": UIDS[3:]}, [], [],
     "has its host"),
    # b is gone: its experts go to the hosts with room, the emptiest first
    ([Host("a", 3, tuple(UIDS[:3])), Host("c", 4)], {"a": UIDS[:3], "c": UIDS[3:]}, [], UIDS[3:], "given a host"),
    # too little room: what fits is hosted, the rest named
    ([Host("a", 2, tuple(UIDS[:2])), Host("c", 1)], {"a": UIDS[:2], "c": UIDS[2:3]}, UIDS[3:], UIDS[2:3],
     "3 of 6 experts have no host: 2 host(s) hold at most 3"),
    # an expert held twice stays with the first node; one past a host's capacity or unknown is given up
    ([Host("a", 2, ("ffn.0", "ffn.1", "ffn.2")), Host("b", 4, ("ffn.0", "ffn.9"))],
     {"a": UIDS[:2], "b": UIDS[2:6]}, [], UIDS[2:], "3 held twice, unknown or past a host's capacity given up"),
    # no host at all
    ([], {}, UIDS, [], "6 of 6 experts have no host: 0 host(s) hold at most 0"),
])
def test_every_expert_gets_one_host(hosts, holds, unhosted, moved, words):
    plan = plan_experts(UIDS, hosts)
    assert {n: list(u) for n, u in plan.holds.items()} == holds
    assert list(plan.unhosted) == unhosted and list(plan.moved) == moved
    assert words in plan.reason
    host_of = plan.host_of()
    assert len(host_of) == len(UIDS) - len(unhosted)  # one host an expert
    for h in hosts:
        assert len(plan.holds[h.node_id]) <= h.capacity


def test_a_plan_is_stable_once_every_expert_has_a_host():
    first = plan_experts(UIDS, [Host("a", 4), Host("b", 4)])
    again = plan_experts(UIDS, [Host(n, 4, u) for n, u in first.holds.items()])
    assert again.holds == first.holds and again.moved == ()
