"""A swarm of virtual peers on a modelled progress board: how rounds form and what the board costs at 100-1000 peers.

No training and no network: each virtual peer takes local steps (a step time drawn per peer), publishes its
progress and reads its key of the board every ``progress_interval``, and decides with the node's own pure
functions (:func:`~cotrain.averaging.progress.round_decision`, :func:`~cotrain.averaging.progress.shard_of`, and
the node's plan of its group and host, :func:`~cotrain.averaging.board_view.board_group`). A planned group meets
when every member planned the same one within ``matchmaking_time``; its all-reduce then takes ``allreduce_s``.
A shared state is one number: a group's members leave with the same new one (their majority's state, or with
``state_averaging`` their states' mean, plus the group's own step: a draw around 1, as groups average different
contributions), a peer that resyncs takes its donor's, and a peer alone adds its own step. How far apart the
peers' states end (``state_spread``: their standard deviation, in group steps) says whether the swarm converges.

What the board costs is counted from its operations with a model of hivemind's Kademlia DHT (the constants below):
a lookup visits the ``SEARCH_BEAM`` peers nearest the key and about log2(N) on the way, each answering with up to
``BUCKET`` contacts; a store goes to ``REPLICAS`` peers; a read gets the key's whole value (every live record in it)
from the replicas it reaches. A record is ``RECORD_BYTES`` on the wire (measured: the signed msgpack of a progress
record with its credential and owner key). The figures are a model's, for the shape of the growth (one key: O(N) a
read; S shards: O(N/S)); the processes of ``bench/scale.py`` measure real nodes.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Optional

from cotrain.averaging.board_view import BoardView, board_time
from cotrain.averaging.dht import REPLICAS, SEARCH_BEAM
from cotrain.averaging.meeting import max_group_size
from cotrain.averaging.scheduler import Move, RoundFacts, Rules, board_group_of, kept_group_of, next_plan
from cotrain.averaging.progress import (PeerProgress, RoundRules, live_peers, shard_of)

#: a progress record on the wire: the signed msgpack of the record (with its ~550-byte credential) and its subkey
#: (peer id and RSA owner key), as measured from the board's own encoding
RECORD_BYTES = 1460
#: routing tables answer 20 contacts (hivemind's bucket size); a value is stored on the REPLICAS peers nearest its
#: key, and a search keeps SEARCH_BEAM of the nearest (cotrain.averaging.dht: the node's own settings)
BUCKET = 20
CONTACT_BYTES = 60  # a peer id and an address in a lookup's answer
REQUEST_BYTES = 120  # a find / store / get request's own bytes, key and framing


def lookup_bytes(n: int) -> int:
    """One Kademlia lookup in a swarm of ``n``: it visits the ``SEARCH_BEAM`` peers nearest the key and about log2(n)
    on the way there (all the others, in a swarm smaller than that), each a request and ``BUCKET`` contacts back."""
    visits = min(n - 1, SEARCH_BEAM + math.ceil(math.log2(max(2, n))))
    return max(1, visits) * (REQUEST_BYTES + BUCKET * CONTACT_BYTES)


@dataclass
class SimConfig:
    peers: int = 100
    shards: int = 1  # averaging.board_shards
    group_rounds: int = 1  # averaging.group_rounds
    group: int = 4  # averaging.target_group_size
    inner_steps: int = 20  # H
    step_s: float = 0.25  # mean seconds a local step takes
    step_spread: float = 0.2  # peers' step times vary by this fraction (lognormal sigma)
    progress_interval: float = 1.0
    round_wait: float = 10.0
    matchmaking_time: float = 3.0
    allreduce_s: float = 0.2
    resync_s: float = 1.0  # downloading a state
    duration_s: float = 120.0
    tick_s: float = 0.05
    seed: int = 0
    state_averaging: bool = False  # averaging.state_averaging


@dataclass
class Peer:
    name: str
    step_s: float
    round: int = 0
    steps: int = 0
    samples: int = 0
    state: float = 0.0
    phase: str = "train"
    mid_round: bool = False
    since: float = 0.0  # when it came to its round
    next_step: float = 0.0
    next_publish: float = 0.0
    busy_until: float = 0.0  # in an all-reduce or a download
    view: list = field(default_factory=list)
    view_round: int = -1
    read_at: float = -1e9
    reached_h_at: Optional[float] = None
    met_round: int = -1
    retry_at: float = 0.0
    meeting: Optional[tuple] = None  # (round, key, members, since)
    last_group: tuple = ()
    kept: Optional[tuple] = None  # (round, members) of its last group (the node's _kept)
    #: from the last read, so that most steps need no decision: the highest round on it, and the rounds at which
    #: some peer was averaging
    view_max_round: int = -1
    view_averaging: frozenset = frozenset()

    def progress(self, now: float) -> PeerProgress:
        return PeerProgress(self.name, self.round, self.steps, self.samples, self.phase, self.mid_round, now,
                            since=self.since)


@dataclass
class SimResult:
    peers: int
    shards: int
    rounds_per_min: float  # the swarm's: group rounds completed per minute, over the peers, per peer
    group_size: float  # mean size of the groups that averaged
    groups: int
    #: contributions that went into a group's average, per peer and minute (at most 60 / (H x step_s))
    averaged_per_peer_min: float
    alone: int  # rounds a peer applied by itself
    failed_meetings: int
    resyncs: int
    records_per_read: float
    dht_bytes_per_node_min: float  # sent and received by an average peer for the board, per minute
    busiest_node_bytes_min: float  # served by the busiest peer (a replica of a popular key), per minute
    states_at_end: int  # distinct shared states held by the peers at the leading round at the end
    state_spread: float  # standard deviation of the states of the peers at the leading round, in group steps
    lead_round: int


class BoardSim:
    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.peers = [Peer(f"p{i:04d}", cfg.step_s * math.exp(self.rng.gauss(0.0, cfg.step_spread)))
                      for i in range(cfg.peers)]
        for p in self.peers:  # not all in step: publications and first steps spread over an interval
            p.next_publish = self.rng.uniform(0, cfg.progress_interval)
            p.next_step = self.rng.uniform(0, p.step_s)
        self.rules = RoundRules(cfg.inner_steps, cfg.round_wait, stale_after=3 * cfg.progress_interval + 1.0)
        self.plan_rules = Rules(self.rules, cfg.inner_steps, "board_only", cfg.group_rounds, cfg.group, cfg.shards > 1,
                                "sim")
        self.shards: list[dict[str, tuple[PeerProgress, float]]] = [{} for _ in range(max(1, cfg.shards))]
        self.meetings: dict[tuple, dict[str, float]] = {}  # (round, group key) -> member -> when it came
        self.bytes_by_peer = {p.name: 0 for p in self.peers}
        self.served = {p.name: 0 for p in self.peers}
        self.reads = self.records_read = 0
        self.groups = self.group_members = self.alone = self.failed = self.resyncs = 0
        self.by_name = {p.name: p for p in self.peers}

    # ---- the board and its traffic -------------------------------------------------------------------------------
    def _replicas(self, key: str) -> list[str]:
        """The peers a key's value lives on: the REPLICAS nearest its hash (a stand-in for XOR distance)."""
        start = int(hashlib.sha1(key.encode()).hexdigest(), 16) % len(self.peers)
        return [self.peers[(start + i) % len(self.peers)].name for i in range(min(REPLICAS, len(self.peers)))]

    def _publish(self, p: Peer, now: float) -> None:
        shard = shard_of("sim", p.round, p.name, len(self.shards), self.cfg.group_rounds)
        self.shards[shard][p.name] = (p.progress(now), now + self.rules.stale_after)
        cost = lookup_bytes(len(self.peers)) + REPLICAS * (REQUEST_BYTES + RECORD_BYTES)
        self.bytes_by_peer[p.name] += cost
        for r in self._replicas(f"shard{shard}"):
            self.served[r] += REQUEST_BYTES + RECORD_BYTES

    def _read(self, p: Peer, now: float) -> None:
        shard = shard_of("sim", p.round, p.name, len(self.shards), self.cfg.group_rounds)
        key = self.shards[shard]
        for name in [n for n, (_, expires) in key.items() if expires < now]:
            del key[name]
        p.view, p.view_round, p.read_at = [rec for rec, _ in key.values()], p.round, now
        p.view_max_round = max((q.round for q in p.view if q.peer_id != p.name), default=-1)
        p.view_averaging = frozenset(q.round for q in p.view if q.phase == "average" and q.peer_id != p.name)
        value = len(p.view) * RECORD_BYTES
        replicas = self._replicas(f"shard{shard}")
        self.bytes_by_peer[p.name] += lookup_bytes(len(self.peers)) + len(replicas) * (REQUEST_BYTES + value)
        for r in replicas:
            self.served[r] += REQUEST_BYTES + value
        self.reads += 1
        self.records_read += len(p.view)

    # ---- a peer's rounds -----------------------------------------------------------------------------------------
    def _advance(self, p: Peer, now: float, state: float, mid_round: bool = False) -> None:
        p.round += 1 if not mid_round else 0
        p.state, p.steps, p.samples, p.phase, p.mid_round = state, 0, 0, "train", mid_round
        p.since = now
        p.reached_h_at, p.meeting = None, None

    def _resync(self, p: Peer, now: float) -> None:
        donors = [q for q in live_peers(p.read_at, p.progress(now), p.view, self.rules) if q.round > p.round]
        if not donors:
            return
        donor = self.by_name[max(donors, key=lambda q: q.round).peer_id]
        p.round = donor.round
        self._advance(p, now, donor.state, mid_round=True)
        p.busy_until = now + self.cfg.resync_s
        self.resyncs += 1

    def _board(self, p: Peer) -> BoardView:
        return BoardView(peers=tuple(p.view), read_at=p.read_at, view_round=p.view_round)

    def _facts(self, p: Peer, now: float) -> RoundFacts:
        """``p``'s round as the node's scheduler takes it (RoundAverager.facts). A failed meeting here pauses the
        peer until its next read (``retry_at``), where the node waits for a read begun after it (``reread_after``)."""
        return RoundFacts(p.progress(now), p.reached_h_at, p.met_round, p.retry_at, 0.0, p.kept, p.last_group)

    def _group(self, p: Peer, now: float) -> Optional[tuple[list[str], str]]:
        """``p``'s group of its round and the group's host, planned as the node plans them (scheduler.board_group_of:
        the group of the round before while it is kept, else from ``p``'s view of the board); None when it has no
        group to meet. Every virtual peer can be dialled."""
        view = self._board(p)
        return board_group_of(view, board_time(view, now, self.rules), self._facts(p, now), self.plan_rules)

    def _go_to_meeting(self, p: Peer, now: float) -> None:
        p.met_round = p.round
        planned = self._group(p, now)
        if planned is None:
            return
        members, host = planned
        key = (p.round, host)
        self.meetings.setdefault(key, {})[p.name] = now
        p.meeting, p.phase = (p.round, key, members, now), "average"

    def _settle_meetings(self, now: float) -> None:
        for key, came in list(self.meetings.items()):
            host = self.by_name[key[1]]  # its plan decides (meet.hold_meeting), once it came
            planned = host.meeting[2] if key[1] in came and host.meeting and host.meeting[1] == key else None
            members = []
            if planned is not None:  # the host's plan, and walk-ins up to the bound (meeting.meeting_outcome)
                members = [m for m in planned if m in came]
                walked = sorted(m for m in came if m not in planned)
                members += walked[:max(0, max_group_size(self.cfg.group) - len(members))]
            # the node's later meeting goes with the planned peers that came (subset); here once the wait is over
            waited = now - min(came.values()) > self.cfg.matchmaking_time
            if len(members) >= 2 and (all(m in came for m in planned) or len(members) >= self.cfg.group or waited):
                for m in came:  # came planning this host, which did not take them: they go back to training
                    if m not in members:
                        q = self.by_name[m]
                        q.meeting, q.phase, q.retry_at = None, "train", now + self.cfg.progress_interval
                states = [self.by_name[m].state for m in members]
                majority = max(set(states), key=lambda s: (states.count(s), s))
                base = statistics.fmean(states) if self.cfg.state_averaging else majority
                new_state = base + self.rng.gauss(1.0, 0.1)
                for m in members:
                    q = self.by_name[m]
                    self._advance(q, now, new_state)
                    q.last_group = tuple(x for x in members if x != m)
                    q.kept = (q.round - 1, tuple(sorted(members)))
                    resync = states[members.index(m)] != majority and not self.cfg.state_averaging
                    q.busy_until = now + self.cfg.allreduce_s + (self.cfg.resync_s if resync else 0.0)
                self.groups += 1
                self.group_members += len(members)
                del self.meetings[key]
            elif now - min(came.values()) > self.cfg.matchmaking_time:
                for m in came:
                    q = self.by_name[m]
                    if q.meeting is not None and q.meeting[1] == key:
                        q.meeting, q.phase = None, "train"
                        q.retry_at = now + self.cfg.progress_interval  # as a reread: try again after a read
                self.failed += 1
                del self.meetings[key]

    def _step(self, p: Peer, now: float) -> None:
        p.steps += 1
        p.samples += 8
        if p.steps >= self.cfg.inner_steps and p.reached_h_at is None:
            p.reached_h_at = now
            if len(self.shards) > 1:  # the node reads its shard afresh for the early meeting (fresh_view_due)
                self._read(p, now)
        if p.meeting is not None:
            return
        if (p.steps < self.cfg.inner_steps and p.view_max_round <= p.round
                and p.round not in p.view_averaging):  # next_plan's answer without asking it: train on
            return
        view, facts = self._board(p), self._facts(p, now)
        plan = next_plan(view, now, facts, self.plan_rules)  # the node's decision, on the same values
        if plan.move is Move.RESYNC:
            self._resync(p, now)
        elif plan.move is Move.AVERAGE:
            live = live_peers(board_time(view, now, self.rules), p.progress(now), p.view, self.rules)
            if not live and kept_group_of(view, facts, self.plan_rules) is None:
                self._advance(p, now, p.state + self.rng.gauss(1.0, 0.1))
                self.alone += 1
            else:
                self._go_to_meeting(p, now)

    def run(self) -> SimResult:
        cfg, now = self.cfg, 0.0
        while now < cfg.duration_s:
            for p in self.peers:
                woken = len(self.shards) > 1 and p.view_round != p.round and p.busy_until <= now  # as the node
                if now >= p.next_publish or woken:
                    self._publish(p, now)
                    self._read(p, now)
                    p.next_publish = now + cfg.progress_interval
                if now >= p.next_step and now >= p.busy_until:
                    if p.meeting is None:
                        self._step(p, now)
                    p.next_step = now + p.step_s
            self._settle_meetings(now)
            now += cfg.tick_s
        lead = max(p.round for p in self.peers)
        minutes = cfg.duration_s / 60.0
        return SimResult(
            peers=cfg.peers, shards=len(self.shards),
            rounds_per_min=statistics.mean(p.round for p in self.peers) / minutes,
            group_size=self.group_members / max(1, self.groups), groups=self.groups,
            averaged_per_peer_min=self.group_members / cfg.peers / minutes, alone=self.alone,
            failed_meetings=self.failed, resyncs=self.resyncs,
            records_per_read=self.records_read / max(1, self.reads),
            dht_bytes_per_node_min=statistics.mean(self.bytes_by_peer.values()) / minutes,
            busiest_node_bytes_min=max(self.served.values()) / minutes,
            states_at_end=len({p.state for p in self.peers if p.round == lead}),
            state_spread=statistics.pstdev([p.state for p in self.peers if p.round == lead]), lead_round=lead)


def simulate(cfg: SimConfig) -> SimResult:
    """Run ``cfg.duration_s`` seconds of a virtual swarm (``cfg.tick_s`` at a time) and sum it up."""
    return BoardSim(cfg).run()
