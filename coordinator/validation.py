"""The coordinator as validator: it checks sampled contributions and keeps each node's reputation.

A node with ``verification.enabled`` keeps the evidence of its last rounds (:mod:`cotrain.verification.evidence`)
and says in each heartbeat which round it holds, with those rounds' signed commitments (:meth:`Validator.
take_commitments`: a contribution that repeats an earlier one, the node's or another's, fails at once).
:meth:`Validator.wants` decides whether to ask for the round: every round of a node on probation (its first checks,
and again after a failed one), then by a draw no node can predict; the node uploads it (``SubmitEvidence``) and :meth:`Validator.offer` queues it. The validator's
thread then checks it, in order:

1. the evidence is well formed and of this run's model (:func:`~cotrain.verification.evidence.decode_evidence`);
2. its commitment is the node's, signed by the record key its credential names, and covers the contribution's very
   bytes (:func:`~cotrain.verification.commitment.verify_commitment`, ``matches``);
3. the contribution is what the node's group took in: every part its reducers reported on their heartbeats
   (:meth:`Validator.take_parts_seen`) and the node signed (a reducer cannot forge that) is of the contribution it
   shows, and has the digest of the same slice (:func:`~cotrain.verification.witness.binding`). The check waits
   :attr:`Validator.witness_wait_s` after the evidence came, for those heartbeats;
4. the bytes the node says it read lie in work units it was given;
5. the contribution lowers the loss on those bytes, and does not raise a random unit's by much
   (:func:`~cotrain.verification.score.loss_score`, with the round's global parameters from the evidence);
6. the round's local steps, replayed from the trace the evidence carries, lead to the contribution
   (:class:`~cotrain.coordinator.replay_check.ReplayCheck`): a node's first check and every check while it is on
   probation after a failed one replay, the others with ``verification.replay_rate``.

Each verdict goes into the reputation :class:`~cotrain.verification.reputation.Book` (kept in the store through
``save``); :meth:`weight` is what the node's credential carries into aggregation, and a node the book says to
suspend is revoked through the revocation list (:meth:`suspended`, which the service adds to the revoked tokens'
nodes).
"""

from __future__ import annotations

import hashlib
import logging
import math
import queue
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch.nn import functional as F

from cotrain.config import RunConfig
from cotrain.data import Corpus
from cotrain.models import build_model
from cotrain.verification import score as scoring
from cotrain.verification.commitment import decode_commitment, matches, verify_commitment
from cotrain.verification.evidence import EvidenceError, decode_evidence, evidence_bytes, merged
from cotrain.verification.reputation import Book, weight_multiplier
from cotrain.verification.witness import MAX_PARTS_SEEN, PartSeen, binding, check_part_seen, part_signed
from cotrain.coordinator.replay_check import ELSEWHERE, READS, ReplayCheck

logger = logging.getLogger(__name__)

#: evidence waiting to be checked at most, in uploads and in bytes: more is refused (the node is asked again later),
#: so a burst of uploads holds a bounded amount of memory (each is 8 bytes a parameter, 20 with a replay's trace).
#: A swarm's first rounds are such a burst: every node is on probation, checked every round, and its first check
#: replays the round; with 4 uploads, 5 nodes on 2 CPUs had their evidence refused for 4 rounds in a row
MAX_QUEUED = 16
MAX_QUEUED_BYTES = 256 << 20
#: how much a failed check weighs, by the check that failed (:mod:`cotrain.verification.score`); 1 when not named.
#: "not_own_data" weighs nothing until bench/verify.py measures the honest advantage: with units drawn from one
#: corpus, an honest node's update can lower a random unit's loss as much as its own
FAIL_WEIGHTS = {scoring.NOT_OWN_DATA: 0.0, ELSEWHERE: 0.0}
#: commitments a heartbeat may carry (a node keeps the evidence of KEEP_ROUNDS rounds)
MAX_COMMITMENTS = 8
#: commitments remembered to find a repeated contribution: rounds of every node, minutes to hours of a run
REMEMBERED_COMMITMENTS = 65536
COPY = "copy"
#: seconds between two writes of the reputation book to the store: a coordinator that dies loses the checks of the
#: last few seconds at most (a suspension is written at once, and its revocation is kept by the issuer)
SAVE_EVERY_S = 5.0
#: the least weight a credential carries: a node whose reputation says less is suspended, not weighted
MIN_WEIGHT = 1e-3
BOUND = "bound"
#: (member, round) whose reducers' reports are remembered: the rounds of every node over the last minutes, longer
#: than evidence waits to be checked
REMEMBERED_PARTS = 16384


@dataclass(frozen=True)
class Candidate:
    """Who sent the evidence, as the coordinator knows it."""
    node_id: str
    token_name: str
    peer_id: str
    record_key: bytes


@dataclass(frozen=True)
class Check:
    """One check's verdict. ``weight``: what it counts for in the reputation (0: nothing)."""
    node_id: str
    round: int
    passed: bool
    failed: str
    reason: str
    weight: float
    #: the round's local steps were replayed and led to the contribution
    replayed: bool = False


@dataclass(frozen=True)
class NodeVerdict:
    """What the health view shows of a node: its checks, those failed that count, those whose replay matched, its
    reputation's weight."""
    checks: int
    fails: int
    score: float
    suspended: bool
    reason: str
    replayed: int = 0


def draw(rng: random.Random, rate: float) -> bool:
    return rng.random() < rate


def check_weight(score: scoring.Score) -> float:
    """What a verdict counts for in the reputation: a pass 1, a failure by :data:`FAIL_WEIGHTS`."""
    return 1.0 if score.passed else FAIL_WEIGHTS.get(score.failed, 1.0)


def spread_windows(ranges: Sequence[tuple[int, int]], count: int, length: int) -> list[int]:
    """``count`` offsets of ``length``-byte windows spread evenly over ``ranges`` (each window inside one range),
    the same for the same arguments."""
    usable = [(a, b) for a, b in ranges if b - a >= length]
    if not usable:
        return []
    out = []
    for i in range(count):
        a, b = usable[i % len(usable)]
        k, per = i // len(usable), math.ceil(count / len(usable))
        out.append(a + (b - a - length) * k // max(1, per - 1) if per > 1 else a)
    return out


class Scorer:
    """The loss score of contributions to the run's language model, on windows of the corpus."""

    def __init__(self, cfg: RunConfig, corpus: Corpus):
        self.cfg, self.corpus = cfg, corpus
        self.model = build_model(cfg).eval()
        self.shapes = [p.shape for p in self.model.parameters()]
        self.numel = sum(p.numel() for p in self.model.parameters())

    def unflat(self, flat: torch.Tensor) -> list[torch.Tensor]:
        out, at = [], 0
        for shape in self.shapes:
            n = math.prod(shape)
            out.append(flat[at:at + n].reshape(shape))
            at += n
        return out

    def _batch(self, ranges: Sequence[tuple[int, int]]) -> Optional[torch.Tensor]:
        length = self.cfg.data.seq_len + 1
        offsets = spread_windows(ranges, self.cfg.verification.score_windows, length)
        if not offsets:
            return None
        rows = [torch.frombuffer(bytearray(self.corpus.read(o, length)), dtype=torch.uint8) for o in offsets]
        return torch.stack(rows).long()

    @torch.no_grad()
    def loss(self, params: Sequence[torch.Tensor], batch: torch.Tensor) -> float:
        for p, value in zip(self.model.parameters(), params):
            p.copy_(value)
        logits, _ = self.model(batch[:, :-1], None)
        return float(F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten()))

    def score(self, params: torch.Tensor, contribution: torch.Tensor, own: Sequence[tuple[int, int]],
              other: Sequence[tuple[int, int]]) -> scoring.Score:
        batches = {"own": self._batch(own), "random": self._batch(other)}
        if batches["own"] is None or batches["random"] is None:
            return scoring.Score("pass", "no unit to score on (none held, or shorter than a window)")
        return scoring.loss_score(lambda ps, which: self.loss(ps, batches[which]), self.unflat(params),
                                  self.unflat(contribution), self.cfg.verification.score_step,
                                  min_own_gain=self.cfg.verification.min_gain)


class Validator(threading.Thread):
    """Checks the evidence it is offered, one at a time, on its own thread. ``own_units(node_id)``: the byte ranges
    the node reads for each unit it holds or finished, the latest first (a unit's streams, one range each): the
    ranges its evidence says it read must lie in them, and without such ranges its latest two units are scored on;
    ``all_units``: every unit's ranges (a random unit the node does not hold is scored against);
    ``on_suspend``: called (on this thread) when a node is to be revoked, with its id and the reason (the service
    revokes :meth:`suspended` nodes on its own, every second)."""

    def __init__(self, cfg: RunConfig, run_id: str, corpus: Corpus,
                 own_units: Callable[[str], list[list[tuple[int, int]]]],
                 all_units: Sequence[Sequence[tuple[int, int]]], on_suspend: Optional[Callable[[str, str], None]] = None,
                 rng: Optional[random.Random] = None, now: Callable[[], float] = time.time,
                 book: Optional[Book] = None, save: Optional[Callable[[dict], None]] = None,
                 witness_wait_s: Optional[float] = None):
        super().__init__(name="validator", daemon=True)
        self.cfg, self.run_id, self.own_units = cfg, run_id, own_units
        self.all_units = [list(u) for u in all_units]
        self.on_suspend, self.now = on_suspend, now
        self.rng = rng or random.Random()
        #: how long evidence waits before it is checked, for its reducers' reports to come: a reducer's next
        #: heartbeat after the round, twice over (None: from the run's heartbeat interval)
        self.witness_wait_s = 2 * cfg.coordinator.heartbeat_interval_s + 1 if witness_wait_s is None else witness_wait_s
        self.scorer = Scorer(cfg, corpus)
        self.replay = ReplayCheck(cfg, corpus.read, self.rng)
        self.book = book or Book()
        #: keeps the book (its plain dict) in the coordinator's store: at most every SAVE_EVERY_S, and at once when a
        #: node is suspended
        self.save, self._saved_at = save, -math.inf
        self._queue: queue.Queue = queue.Queue(MAX_QUEUED)
        self._queued_bytes = 0  # of the uploads in the queue
        self._lock = threading.Lock()
        self._offered: dict[str, int] = {}  # node -> the latest round it offered, drawn for or not
        self._requested: dict[str, int] = {}  # node -> the round whose evidence it was asked for, until it came
        self._counts: dict[str, tuple[int, int, str, int]] = {}  # node -> (checks, fails, last reason, replayed)
        self._since_fail: dict[str, int] = {}  # node -> its checks since its last failed one that counts
        self._suspended: dict[str, str] = {}
        self.refused = 0  # evidence refused before scoring (malformed, unsigned, queue full)
        self.scoring_s = 0.0  # CPU seconds of this thread spent checking
        self._halt = threading.Event()
        #: digest -> (node, round) of its first commitment, and what was seen, oldest first (bounded)
        self._digests: OrderedDict[bytes, tuple[str, int]] = OrderedDict()
        self._committed: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        #: (member peer, round) -> {(reducer node, start): its report}, oldest first (bounded)
        self._parts: OrderedDict[tuple[str, int], dict[tuple[str, int], PartSeen]] = OrderedDict()
        #: the digest of an all-zero contribution: repeated by any node that took no step, and the loss score's to judge
        self._zeros = hashlib.sha256(bytes(4 * self.scorer.numel)).digest()

    # ---- the service's side (the event loop's thread) ----------------------------------------------------------
    def wants(self, node_id: str, latest: int) -> int:
        """The round whose evidence to ask ``node_id`` for, which holds ``latest``; 0: none. Every new round of a node
        on probation, else one drawn with ``sample_rate``."""
        with self._lock:
            if latest <= self._offered.get(node_id, 0) or node_id in self._suspended:
                return 0
            self._offered[node_id] = latest
            if not self._on_probation(node_id) and not draw(self.rng, self.cfg.verification.sample_rate):
                return 0
            self._requested[node_id] = latest
        return latest

    def _on_probation(self, node_id: str) -> bool:
        """Fewer than ``probation_checks`` checks, or as many since its last failed check that counts (under the
        lock): a node that failed is watched every round until it passes that many again."""
        probation = self.cfg.verification.probation_checks
        return self._counts.get(node_id, (0,))[0] < probation or self._since_fail.get(node_id, probation) < probation

    def _replay_due(self, node_id: str) -> bool:
        """A node's first check, and its checks on probation after a failed one, replay the round: an attacker from
        its first round is caught at its first check, and one caught is watched by the replay until it passes."""
        with self._lock:
            first = self._counts.get(node_id, (0,))[0] == 0
            return first or node_id in self._since_fail and self._on_probation(node_id)

    def take_commitments(self, who: Candidate, encoded: Sequence[bytes]) -> str:
        """The commitments a heartbeat of ``who`` carried (hostile bytes): each new one that is ``who``'s, signed, is
        remembered; one whose digest an earlier commitment holds is a stale or copied update, a failed check of the
        later one. -> why some were refused ("" when none was)."""
        refused = []
        for data in encoded[:MAX_COMMITMENTS]:
            decoded = decode_commitment(data)
            if not decoded.ok:
                refused.append(decoded.reason)
                continue
            c = decoded.commitment
            with self._lock:
                if (who.node_id, c.round) in self._committed:
                    continue
            signed = verify_commitment(data, who.record_key, run_id=self.run_id, round=c.round, peer_id=who.peer_id)
            if not signed.ok:
                refused.append(signed.reason)
                continue
            with self._lock:
                self._committed[(who.node_id, c.round)] = c.digest
                earlier = None if c.digest == self._zeros else self._digests.setdefault(c.digest, (who.node_id,
                                                                                                    c.round))
                for table in (self._committed, self._digests):
                    while len(table) > REMEMBERED_COMMITMENTS:
                        table.popitem(last=False)
            if earlier is not None and earlier != (who.node_id, c.round):
                whose = "its own" if earlier[0] == who.node_id else f"node {earlier[0][:8]}'s"
                self.record(who, Check(who.node_id, c.round, False, COPY, f"its contribution of round {c.round} "
                                       f"repeats {whose} of round {earlier[1]} (stale or copied)", 1.0))
        if len(encoded) > MAX_COMMITMENTS:
            refused.append(f"commitments: {len(encoded)}, at most {MAX_COMMITMENTS}")
        if refused:
            with self._lock:
                self.refused += len(refused)
        return "; ".join(refused)

    def take_parts_seen(self, who: Candidate, parts: Sequence[PartSeen]) -> str:
        """What ``who`` reduced of its groupmates' contributions, as its heartbeat says (hostile: each bounded and
        checked); a report of its own contribution is no witness and is left out. -> why some were refused ("" when
        none was)."""
        refused = [f"parts_seen: {len(parts)}, at most {MAX_PARTS_SEEN}"] if len(parts) > MAX_PARTS_SEEN else []
        with self._lock:
            for part in parts[:MAX_PARTS_SEEN]:
                wrong = check_part_seen(part)
                if wrong:
                    refused.append(wrong)
                    continue
                if part.member == who.peer_id:
                    continue
                reports = self._parts.setdefault((part.member, part.round), {})
                if len(reports) < MAX_PARTS_SEEN:
                    reports[(who.node_id, part.start)] = part
            while len(self._parts) > REMEMBERED_PARTS:
                self._parts.popitem(last=False)
            self.refused += len(refused)
        return "; ".join(refused)

    def parts_seen(self, peer_id: str, round_number: int) -> list[tuple[str, PartSeen]]:
        """The reports of what reducers took in of ``peer_id``'s contribution of ``round_number``: (reducer, report)."""
        with self._lock:
            return [(node, part) for (node, _), part in self._parts.get((peer_id, round_number), {}).items()]

    def requested(self, node_id: str) -> int:
        """The round whose evidence ``node_id`` was asked for and has not sent yet (0: none)."""
        with self._lock:
            return self._requested.get(node_id, 0)

    def offer(self, who: Candidate, round_number: int, data: bytes) -> str:
        """Queue uploaded evidence for checking; -> "" when queued, else why not."""
        # the node's units as they are now: checked after the reducers' reports came, the node may have left and its
        # units gone back to the pool
        item = (who, round_number, data, time.monotonic(), self.own_units(who.node_id))
        with self._lock:  # the service's loop is the only one that queues: a queue with room takes the item
            if self._requested.get(who.node_id) == round_number:
                del self._requested[who.node_id]
            room = self._queued_bytes + len(data) <= MAX_QUEUED_BYTES and not self._queue.full()
            if room:
                self._queued_bytes += len(data)
                self._queue.put_nowait(item)
            else:
                self.refused += 1
        return "" if room else "the validator is busy: ask again later"

    def max_evidence_bytes(self) -> int:
        """The most bytes a node's evidence of a round takes in this run (with its trace, where rounds are replayed):
        an upload past it is refused as it comes."""
        return evidence_bytes(self.scorer.numel) + self.replay.max_bytes

    def weight(self, node_id: str) -> float:
        """The weight the node's checks give it in aggregation, in (0, 1] (a suspended node is revoked instead)."""
        now = self.now()
        with self._lock:
            rep = self.book.nodes.get(node_id)
            weight = 1.0 if rep is None else weight_multiplier(rep, now, self.book.policy)
        return min(1.0, max(MIN_WEIGHT, weight))

    def totals(self) -> tuple[float, int]:
        """(CPU seconds spent checking, checks made)."""
        with self._lock:
            return self.scoring_s, sum(c[0] for c in self._counts.values())

    def suspended(self) -> set[str]:
        with self._lock:
            return set(self._suspended)

    def verdicts(self) -> dict[str, NodeVerdict]:
        now = self.now()
        with self._lock:
            counts, suspended = dict(self._counts), dict(self._suspended)
            # the node's own reputation: a token's waits for tokens per volunteer (a swarm's nodes may share one)
            weights = {n: weight_multiplier(self.book.nodes[n], now, self.book.policy) for n in counts
                       if n in self.book.nodes}
        return {node_id: NodeVerdict(checks, fails, weights.get(node_id, 1.0), node_id in suspended,
                                     suspended.get(node_id) or reason, replayed)
                for node_id, (checks, fails, reason, replayed) in counts.items()}

    # ---- the validator's thread ----------------------------------------------------------------------------------
    def run(self) -> None:
        while not self._halt.is_set():
            try:
                who, round_number, data, came, units = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            with self._lock:
                self._queued_bytes -= len(data)
            if self._halt.wait(max(0.0, came + self.witness_wait_s - time.monotonic())):  # the reducers' reports
                break
            started = time.thread_time()
            try:
                check = self.check(who, round_number, data, units)
            except Exception as e:  # noqa: BLE001 - a bug in scoring must not stop the coordinator
                logger.exception("validator: checking round %d of node %s failed", round_number, who.node_id[:8])
                check = Check(who.node_id, round_number, True, "", f"not checked: {type(e).__name__}", 0.0)
            with self._lock:
                self.scoring_s += time.thread_time() - started
            self.record(who, check)

    def stop(self) -> None:
        self._halt.set()

    def check(self, who: Candidate, round_number: int, data: bytes,
              units: Optional[list[list[tuple[int, int]]]] = None) -> Check:
        """The verdict on ``who``'s evidence of ``round_number`` (hostile bytes); ``units``: the node's units when the
        evidence came (None: ``own_units`` now)."""
        def failed(what: str, reason: str) -> Check:
            return Check(who.node_id, round_number, False, what, reason, 1.0)

        try:
            ev = decode_evidence(data, self.scorer.numel, self.replay.decoder, self.replay.max_bytes)
        except EvidenceError as e:
            return failed(scoring.MALFORMED, str(e))
        if ev.round != round_number:
            return failed(scoring.MALFORMED, f"evidence.round: {ev.round}, round {round_number} was asked for")
        signed = verify_commitment(ev.commitment, who.record_key, run_id=self.run_id, round=round_number,
                                   peer_id=who.peer_id)
        if not signed.ok:
            return failed("commitment", signed.reason)
        revealed = matches(signed.commitment, ev.contribution_bytes)
        if not revealed.ok:
            return failed("commitment", revealed.reason)
        signed = [(reducer, part) for reducer, part in self.parts_seen(who.peer_id, round_number)
                  if part_signed(who.record_key, self.run_id, part)]  # a report not signed by the node is no proof
        other_than_sent = binding(ev.contribution, signed)
        if other_than_sent:
            return failed(BOUND, f"{other_than_sent}: the group got another contribution than the evidence")
        units = self.own_units(who.node_id) if units is None else units
        given = merged([r for u in units for r in u])
        outside = next(((a, b) for a, b in ev.reads if not any(c <= a and b <= d for c, d in given)), None)
        if outside is not None:
            return failed(READS, f"evidence.reads: bytes [{outside[0]}, {outside[1]}) are in no work unit this node "
                          "was given")
        own = list(ev.reads) or [r for u in units[:2] for r in u]
        held = {r for u in units for r in u}
        others = [u for u in self.all_units if held.isdisjoint(u)] or self.all_units
        other = others[self.rng.randrange(len(others))]
        try:
            result = self.scorer.score(ev.params, ev.contribution, own, other)
        except ValueError as e:  # the global parameters in the evidence give no finite loss
            return failed(scoring.MALFORMED, f"evidence.params: {e}")
        replayed = result.passed and self.replay.drawn(self._replay_due(who.node_id))
        if replayed:
            result = self.replay.check(ev, given)
        return Check(who.node_id, round_number, result.passed, result.failed, result.reason, check_weight(result),
                     replayed and result.passed)

    def record(self, who: Candidate, check: Check) -> None:
        now = self.now()
        suspend = None
        with self._lock:
            checks, fails, _, replayed = self._counts.get(who.node_id, (0, 0, "", 0))
            counted = check.passed or check.weight > 0
            verdict_words = "passed" if check.passed else "FAILED" if counted else "inconclusive (not counted)"
            self._counts[who.node_id] = (checks + 1, fails + (counted and not check.passed),
                                         f"round {check.round}: {verdict_words}: {check.reason}",
                                         replayed + check.replayed)
            if counted and not check.passed:
                self._since_fail[who.node_id] = 0
            elif who.node_id in self._since_fail:
                self._since_fail[who.node_id] += 1
            if check.weight > 0:
                self.book.record(who.node_id, who.token_name, passed=check.passed, weight=check.weight, now=now,
                                 reason=check.reason)
            # a node is suspended for its own checks: the book's token verdict waits for tokens per volunteer
            verdict = self.book.suspension(who.node_id, who.token_name, now)
            if verdict.suspend and verdict.reason.startswith("node ") \
                    and who.node_id not in self._suspended:
                self._suspended[who.node_id] = verdict.reason
                suspend = verdict.reason
            saving = self.save is not None and check.weight > 0 and (suspend is not None
                                                                      or now - self._saved_at >= SAVE_EVERY_S)
            if saving:
                self._saved_at, snapshot = now, self.book.to_dict()
        if saving:
            try:
                self.save(snapshot)
            except Exception as e:  # noqa: BLE001 - a busy or full store: the next save tries again
                logger.warning("validator: could not keep the reputations in the store (%s); retrying later", e)
        level = logging.WARNING if counted and not check.passed else logging.DEBUG
        logger.log(level, "validator: node %s, round %d: %s", who.node_id[:8], check.round, check.reason)
        if suspend is not None:
            logger.warning("validator: revoking node %s: %s", who.node_id[:8], suspend)
            if self.on_suspend is not None:
                self.on_suspend(who.node_id, suspend)
