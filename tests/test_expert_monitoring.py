"""What the coordinator shows of a hosted mixture's experts (issue 56): each host's experts and the calls they
answered, their load per expert, refusals, and the trainers' failed calls and skipped steps, in the health view,
`swarm status` and /metrics; a host's load report is bounded to what it holds."""

from cotrain.coordinator.expert_intake import experts_health
from cotrain.coordinator.expert_pool import ExpertPool, Load
from cotrain.coordinator.web import SwarmCollector
from cotrain.status import experts_lines
from cotrain.v1 import coordinator_pb2 as pb

UIDS = [f"moe0.{i}.{j}" for i in range(2) for j in range(2)]


def pool_with_load() -> ExpertPool:
    pool = ExpertPool(UIDS, now=lambda: 100.0)
    a = pool.report("node-a", "peer-a", 2, [])
    b = pool.report("node-b", "peer-b", 2, [])
    # a reports the calls of what it holds, and of an expert it does not hold (dropped: hostile or stale)
    pool.report("node-a", "peer-a", 2, a, served=[Load(a[0], 10, 7, 7), Load(a[1], 3, 0), Load(b[0], 999, 999)],
                refused=2)
    pool.report("node-b", "peer-b", 2, b, served=[Load(b[0], 5, 5, 9, 4), Load(b[1], -4, 1)])
    return pool


def health_of(pool: ExpertPool) -> pb.SwarmHealth:
    health = pb.SwarmHealth(run_id="r", now_unix=110.0, nodes=[
        pb.NodeHealth(node_id="t", node_name="trainer", state="healthy",
                      metrics=pb.NodeMetrics(expert_calls_failed=4, steps_skipped=2))])
    health.experts.CopyFrom(experts_health(pool, {"node-a": "host-a", "node-b": "host-b"}))
    return health


def test_the_health_view_has_each_hosts_experts_and_the_calls_they_answered():
    e = health_of(pool_with_load()).experts
    assert (e.experts, e.hosted) == (4, 4) and [h.node_name for h in e.hosts] == ["host-a", "host-b"]
    a, b = e.hosts
    assert len(a.holds) == 2 and {x.uid for x in a.served} == set(a.holds)  # not b's expert
    assert sum(x.forward + x.backward for x in a.served) == 20 and a.refused == 2
    assert {(x.forward, x.backward) for x in b.served} == {(5, 5), (0, 1)}  # a negative count is 0
    assert {(x.updates, x.started_from) for x in b.served} == {(9, 4), (0, 0)}
    assert a.last_report_unix == 100.0


def test_metrics_carry_the_calls_by_expert_and_host_and_the_trainers_failures():
    samples = {}
    for family in SwarmCollector(lambda: health_of(pool_with_load())).collect():
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("cotrain_experts_hosted", ())] == 4 and samples[("cotrain_expert_hosts", ())] == 2
    calls = {labels: v for (name, labels), v in samples.items() if name == "cotrain_expert_calls_total"}
    assert sum(calls.values()) == 31 and len(calls) == 8  # 4 experts x (forward, backward)
    assert samples[("cotrain_node_expert_calls_failed_total", (("node", "trainer"), ("state", "healthy")))] == 4
    assert samples[("cotrain_node_steps_skipped_total", (("node", "trainer"), ("state", "healthy")))] == 2


def test_swarm_status_says_it_and_a_run_without_experts_says_nothing():
    lines = experts_lines(health_of(pool_with_load()))
    assert len(lines) == 5  # the pool, two hosts, calls per expert, the trainers
    assert "4 of 4" in lines[0] and "host-a" in lines[1] and "20" in lines[1]
    assert experts_lines(pb.SwarmHealth(run_id="r")) == []
