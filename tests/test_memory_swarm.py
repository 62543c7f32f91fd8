"""The real strategies' rounds among three peers of one process (cotrain.averaging.testing.MemorySwarm): the board's
meetings, the all-reduce, overlap, a peer that downloads the state, and a peer that stops mid-round, in seconds."""

import threading
import time

import pytest
import torch

from cotrain.averaging import build_strategy
from cotrain.averaging.admission import Admission
from cotrain.averaging.board_view import board_time
from cotrain.averaging.progress import live_peers
from cotrain.averaging.testing import ManualClock, MemorySwarm, memory_peer_id
from cotrain.config import RunConfig

RUN = "memory"


def run_config(compression: str = "", **averaging) -> RunConfig:
    # the user's defaults, with a board read every 50 ms and short waits: a swarm in one process needs no more
    fast = dict(inner_steps=4, progress_interval=0.05, matchmaking_time=1.0, request_timeout=0.5,
                allreduce_timeout=5.0, round_wait=1.0)
    codec = {"compression": {"kind": compression}} if compression else {}
    return RunConfig().with_overrides(run={"name": RUN}, averaging={**fast, **averaging}, **codec)


class Peer:
    """A tiny model trained on its own random regression task, averaging with the others."""

    def __init__(self, swarm: MemorySwarm, name: str, cfg: RunConfig, seed: int):
        #: a ManualClock moves 5 ms a step: the swarm's time goes on as the peers train, and stands when they stop
        self.clock = swarm.clock if isinstance(swarm.clock, ManualClock) else None
        torch.manual_seed(0)  # every peer starts from the same model, as a swarm's warm start gives it
        self.model = torch.nn.Linear(8, 1)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.data = torch.Generator().manual_seed(seed)
        self.peer_id = memory_peer_id(name)
        self.averaging = build_strategy(self.model, self.optimizer, None, RUN, cfg, self.peer_id,
                                       Admission(RUN, None, enabled=False), ports=swarm.ports(self.peer_id))
        self.error = None

    def step(self) -> None:
        x = torch.randn(16, 8, generator=self.data)
        loss = (self.model(x).squeeze(1) - x.sum(1)).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.averaging.local_step()
        self.averaging.after_local_step(16)
        if self.clock is not None:
            self.clock.advance(0.005)

    def train_until(self, done, deadline: float) -> None:
        try:
            while not done(self) and time.monotonic() < deadline:
                self.step()
        except Exception as e:  # noqa: BLE001 - the test reports it
            self.error = e


def train(peers, done, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=p.train_until, args=(done, deadline), daemon=True) for p in peers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 10)
    assert all(p.error is None for p in peers), [p.error for p in peers]


@pytest.fixture
def swarm():
    made = []

    def make(count: int, compression: str = "", clock=None, **averaging):
        swarm, cfg = MemorySwarm(RUN, clock=clock), run_config(compression, **averaging)
        peers = [Peer(swarm, f"p{i}", cfg, seed=i) for i in range(count)]
        made.extend(peers)
        for p in peers:  # as a node does before it trains: a peer alone on its board averages alone
            assert p.averaging.wait_for_peers(count, timeout=10.0) == count
        return swarm, peers

    yield make
    for p in made:
        p.averaging.shutdown()


def same_state(peers) -> bool:
    return len({p.averaging.state.hash for p in peers}) == 1


@pytest.mark.parametrize("strategy, overlap, compression", [
    ("diloco", False, ""), ("diloco", True, ""), ("sync", False, ""),
    ("diloco", False, "sparse"), ("diloco", False, "powersgd"), ("diloco", False, "int8"),
    ("diloco", False, "butterfly"),
])
def test_three_peers_average_into_one_shared_state(swarm, strategy, overlap, compression):
    # the model's 9 values ride with the meeting (a vector the butterfly would give one reducer); "butterfly" parts
    # them over the three peers instead, as a larger model's are; the sparse codec averages with its own aggregator
    extra = {"sparse": {"aggregation": "clipped_mean"}, "butterfly": {"min_part_values": 1}}.get(compression, {})
    _, peers = swarm(3, strategy=strategy, overlap=overlap, compression=compression.replace("butterfly", ""),
                     **extra)
    train(peers, lambda p: p.averaging.round >= 4)
    assert all(p.averaging.round >= 4 for p in peers), [p.averaging.round for p in peers]
    rounds = [p.averaging.stats.snapshot() for p in peers]
    assert all(r.rounds_completed >= 2 and r.groups_from_board >= 2 for r in rounds), rounds
    # at the same round every peer holds the same global parameters: stop them there and compare
    target = max(p.averaging.round for p in peers) + 1
    train(peers, lambda p: p.averaging.round >= target)
    at = {p.averaging.round for p in peers}
    if len(at) == 1:
        assert same_state(peers)
    counted = {p.averaging.tally.samples_total for p in peers if p.averaging.round == max(at)}
    assert len(counted) == 1 and counted.pop() > 0  # one count of the swarm's samples at a round


def test_a_peer_that_joins_late_downloads_the_state_and_averages(swarm):
    memory, peers = swarm(3)
    late = peers[2]
    memory.freeze(late.peer_id)
    train(peers[:2], lambda p: p.averaging.round >= 3)
    memory.thaw(late.peer_id)
    assert late.averaging.state.download(timeout=5.0)
    assert late.averaging.round >= 3
    # everyone trains on until the late peer averaged with the others (it goes on from the state it took)
    train(peers, lambda p: late.averaging.stats.rounds_completed >= 1)
    assert late.averaging.stats.snapshot().rounds_completed >= 1


def test_a_peer_that_stops_mid_round_leaves_the_others_averaging(swarm):
    memory, peers = swarm(3)
    train(peers, lambda p: p.averaging.round >= 2)
    memory.freeze(peers[2].peer_id)  # its records stop, and it answers nobody: gone, as a killed node
    start = min(p.averaging.round for p in peers[:2])
    train(peers[:2], lambda p: p.averaging.round >= start + 3)
    assert all(p.averaging.round >= start + 3 for p in peers[:2]), [p.averaging.round for p in peers]
    assert list(peers[0].averaging.stats.snapshot().last_group) == [peers[1].peer_id]


def test_a_frozen_peer_is_gone_when_the_swarms_clock_has_aged_its_record(swarm):
    clock = ManualClock()
    memory, peers = swarm(3, clock=clock)
    train(peers, lambda p: p.averaging.round >= 2)
    memory.freeze(peers[2].peer_id)
    me = peers[0].averaging

    def live_after_next_reads() -> set:
        reads = me.stats.board_reads
        deadline = time.monotonic() + 10.0
        while me.stats.board_reads < reads + 3:  # it reads every 50 ms
            assert time.monotonic() < deadline, "peer 0 stopped reading the board"
            time.sleep(0.01)
        view = me.view
        return {p.peer_id for p in live_peers(board_time(view, clock.now(), me.rules), me.progress(), view.peers,
                                              me.rules)}

    # while the clock stands, its last record is as fresh as when it was written, however long the test waits
    assert peers[2].peer_id in live_after_next_reads()
    clock.advance(me.rules.stale_after + 0.5)
    assert live_after_next_reads() == {peers[1].peer_id}  # the live peer published afresh; the frozen one did not
    start = min(p.averaging.round for p in peers[:2])
    train(peers[:2], lambda p: p.averaging.round >= start + 2)
    assert all(p.averaging.round >= start + 2 for p in peers[:2]), [p.averaging.round for p in peers]
    assert list(me.stats.snapshot().last_group) == [peers[1].peer_id]
