"""The coordinator's expert hosts (coordinator/expert_pool.ExpertPool) on an injected clock: reports give each host
its experts, every expert one host; a host that goes silent past lost_after_s, or leaves, has its experts moved to
the others; hostile reports (huge capacity, unknown experts) are bounded."""

from cotrain.coordinator.expert_pool import MAX_CAPACITY, ExpertPool

UIDS = [f"ffn.{i}.{j}" for i in range(2) for j in range(2)]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_hosts_share_the_grid_and_a_silent_hosts_experts_move_within_lost_after():
    clock = Clock()
    pool = ExpertPool(UIDS, lost_after_s=20.0, now=clock)
    a = pool.report("a", "peer-a", 2, [])
    b = pool.report("b", "peer-b", 4, [])
    assert len(a) == 2 and set(a) | set(b) == set(UIDS) and not set(a) & set(b)
    assert pool.directory() == {**{u: "peer-a" for u in a}, **{u: "peer-b" for u in b}}
    for _ in range(3):  # both report every 5 s: nothing moves
        clock.t += 5
        assert pool.report("a", "peer-a", 2, a) == a and pool.report("b", "peer-b", 4, b) == b
    clock.t += 5
    pool.report("b", "peer-b", 4, b)
    clock.t += 16  # a silent for 21 s: gone
    assert set(pool.report("b", "peer-b", 4, b)) == set(UIDS)
    assert set(pool.directory().values()) == {"peer-b"}
    hosts, hosted, reason = pool.status()
    assert (hosts, hosted) == (1, 4) and "has its host" in reason


def test_a_host_that_leaves_gives_its_experts_up_at_once_and_too_little_room_is_said():
    pool = ExpertPool(UIDS, now=Clock())
    pool.report("a", "peer-a", 2, [])
    pool.report("b", "peer-b", 2, [])
    pool.leave("b")
    hosts, hosted, reason = pool.status()
    assert (hosts, hosted) == (1, 2) and "2 of 4 experts have no host" in reason
    assert len(pool.directory()) == 2


def test_hostile_reports_are_bounded():
    pool = ExpertPool(UIDS, now=Clock())
    assert set(pool.report("a", "peer-a", 10 ** 12, ["ffn.9.9", "x" * 10_000, *UIDS])) == set(UIDS)
    assert pool.report("b", "peer-b", -5, UIDS) == ()  # no room: it holds nothing, a holds on
    assert set(pool.directory().values()) == {"peer-a"}
    assert MAX_CAPACITY >= len(UIDS)
