"""Rounds of averaging among the peers of a swarm: the machinery both strategies (DiLoCo, sync) share.

A round: every peer trains locally; when the swarm is ready (:func:`round_decision` on the progress board), the
peers at the same round form a group (hivemind's matchmaking: the round number is the group key, so only peers
of one round meet), run a butterfly all-reduce of their compressed contributions over hivemind's libp2p daemon
(:mod:`cotrain.averaging.allreduce`), and apply the same update. Rounds stay consistent by construction:

- every peer of a group decodes the very same bytes, so the shared state stays bitwise identical;
- peers exchange a hash of their shared state when they form a group; a peer whose state differs from the
  group's majority downloads the state instead of applying the round;
- a peer that sees another ahead of it downloads the state from the peer with the most progress;
- matchmaking and all-reduce have time limits; a contribution that does not arrive is left out and counted;
  after a failed round the peer keeps training and tries again;
- a peer alone in the swarm applies its own contribution.

:class:`RoundAverager` is the front: it keeps where the peer stands (:class:`~cotrain.averaging.position.Position`)
and the shared state (:class:`~cotrain.averaging.state_keeper.StateKeeper`), and changes them only on the node's main
thread. It asks :mod:`cotrain.averaging.scheduler` when a round ends, and hands the round to
:class:`~cotrain.averaging.round_run.RoundRun` (group formation, :mod:`cotrain.averaging.formation`; reduction,
:mod:`cotrain.averaging.reduction`), which returns a :class:`~cotrain.averaging.outcome.RoundResult` it acts on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Mapping, Optional, Sequence

import torch
from hivemind.dht import DHT

from cotrain.averaging.admission import Admission
from cotrain.averaging.board_publisher import BoardPublisher
from cotrain.averaging.board_view import (BoardView, awaiting_read, board_time, view_stale,
                                          view_steady)
from cotrain.averaging.formation import GroupFormer
from cotrain.averaging.groups import kept_group
from cotrain.averaging.meeting import meeting_key, meeting_piece_bound
from cotrain.averaging.outcome import Kind, RoundResult
from cotrain.averaging.ports import Ports
from cotrain.averaging.position import Position
from cotrain.averaging.overlap import PendingRound
from cotrain.averaging.reduction import Reduction
from cotrain.averaging.round_run import OnSent, RoundRun
from cotrain.averaging.round_stats import RoundStats
from cotrain.averaging.scheduler import (Move, RoundFacts, Rules, board_group_of, kept_group_of, next_plan,
                                         reads_paused)
from cotrain.averaging.progress import (Action, Decision, PeerProgress, Phase, RoundRules, live_peers)
from cotrain.averaging.state import STATE_KEY
from cotrain.averaging.shared_state import SharedState
from cotrain.averaging.state_keeper import StateKeeper
from cotrain.averaging.state_source import StateSource
from cotrain.averaging.strategy import Strategy
from cotrain.averaging.tally import Tally
from cotrain.config import AveragingConfig, CompressionConfig
from cotrain.verification.witness import PartSigning
from cotrain.optim.schedule import RoundClock
from cotrain.outage import Repeats

logger = logging.getLogger(__name__)

class RoundAverager:
    """A peer's rounds of averaging with ``strategy`` (cotrain.averaging.strategy: DiLoCo or sync, by composition):
    the node calls :meth:`local_step` then :meth:`after_local_step` for every local batch of ``model``."""

    def __init__(self, strategy: Strategy, model: torch.nn.Module, dht: Optional[DHT], run_id: str,
                 cfg: AveragingConfig, compression: CompressionConfig, peer_id: str,
                 client_mode: bool = False, seed: int = 0, upload_bps: float = 0.0, record_key=None,
                 attack: str = "", *, admission: Admission, step_samples: int = 0,
                 outer_lr_at: Optional[Callable[[float], float]] = None, overclaim: float = 1.0,
                 ports: Optional[Ports] = None, on_sent: Optional[OnSent] = None):
        """``ports``: the board, exchange and matchmaker this peer's rounds use (cotrain.averaging.ports); None: a
        node's, built on ``dht``. ``on_sent``: hears each round's contribution as sent (a validator's evidence)."""
        self.strategy, self.dht, self.cfg, self.peer_id = strategy, dht, cfg, peer_id
        #: nobody can dial this peer: it reduces no part of an all-reduce (its groupmates behind NAT could not
        #: fetch it)
        self.client_mode = client_mode
        self.params = [p for p in model.parameters()]
        self.param_names = [n for n, _ in model.named_parameters()]
        #: a bench's liar: it says this many times the samples it trained on (honest peers: 1)
        self.overclaim = max(1.0, float(overclaim))
        self.rules = RoundRules(cfg.inner_steps, cfg.round_wait, stale_after=3 * cfg.progress_interval + 1.0)
        self.admission = admission
        self.ports = ports or Ports.over_dht(dht, run_id, cfg, admission, ttl=self.rules.stale_after,
                                             record_key=record_key, client_mode=client_mode, upload_bps=upload_bps)
        #: the swarm's time (cotrain.averaging.clock): a record's time, a round's start, the board's ages
        self.now = self.ports.clock.now
        #: where this peer stands on the swarm's clock: the swarm's samples, its own, every peer's as last seen
        self.tally = Tally.for_run(peer_id, cfg.inner_steps, step_samples)
        #: where this peer stands in its rounds; only this front changes it, on the node's main thread
        self.at = Position(since=self.now(), clock=self.tally.round_clock())
        #: schedule.outer: the outer step's lr factor at the swarm's samples, taken at the applied round's clock
        self.outer_lr_at = outer_lr_at
        self.stats = RoundStats()
        #: a round's decision, its end and a meeting that failed, each logged once every 10 s while it says the same
        #: (rounds come many a second, and a peer waiting for its groupmates meets again at every step)
        self._news = Repeats(logger)
        #: averaging.overlap: rounds run on this worker thread while the node trains on; one at a time
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="round") if cfg.overlap else None
        if self._worker is not None:  # its thread starts now, not at the first round: it inherits the priority of
            self._worker.submit(int).result()  # the thread that starts it, and the node's training runs nicer
        self._pending: Optional[PendingRound] = None
        self.board, self.exchange, self.averager = self.ports.board, self.ports.exchange, self.ports.matchmaker
        #: averaging.board_shards > 1: this peer reads only its shard's key at its round, so the view of one round
        #: says nothing about the next (see board_view.view_stale)
        self.sharded = self.board.shards > 1
        #: what the config says about when rounds end and who meets (cotrain.averaging.scheduler)
        self.plan_rules = Rules(self.rules, cfg.inner_steps, cfg.group_formation, cfg.group_rounds,
                                cfg.target_group_size, self.sharded, run_id)
        #: what this peer's board record says it does; only the node's main thread changes it
        self.phase = Phase.TRAIN
        self._stop = threading.Event()
        #: this peer's record on the board, and its view of the others' (:attr:`view`), kept by a thread of its own
        self._publisher = BoardPublisher(
            self.board, cfg.progress_interval, progress=lambda: self.progress(self.phase), paused=self._reads_paused,
            steady=lambda view: view_steady(view, self.sharded, self.peer_id, self.stats.last_group),
            stats=self.stats, on_counts=self.tally.observe, now=self.now)
        #: what the round's contributions go through on the wire, and what compression left out of them
        self.reduction = Reduction(self.exchange, cfg, compression, [p.shape for p in self.params],
                                   strategy.feedback, seed, attack)
        #: the state every member of a group holds identically, its hash, and the checkpoint a joiner downloads
        self.shared = SharedState(strategy, self.reduction, self.param_names, run_id)
        #: a meeting's members join its host with their meetings (a hosted round's contribution riding on them)
        self.exchange.max_deposit_bytes = meeting_piece_bound(self.reduction.deposit_bound())
        #: where this peer takes the shared state from when it joins or falls behind
        self.source = StateSource(self.exchange, peer_id, run_id, view=lambda: self.view,
                                  read_all=self.board.read_all,
                                  wait_for_read=lambda timeout: self._publisher.wait_for_read(timeout=timeout),
                                  sharded=self.sharded, stale_after=self.rules.stale_after,
                                  progress_interval=cfg.progress_interval, retry_wait_s=cfg.matchmaking_time,
                                  stop=self._stop, now=self.now)
        #: the shared state as it goes out to the node and to joiners, and as it comes in
        self.state = StateKeeper(self.shared, self.source, strategy, self.reduction, self.at, self.tally,
                                 self.param_names, self.now)
        self.exchange.provide(STATE_KEY, self.state.encoded)
        #: who averages in a round, and the round's network side from its launch to its result
        self.former = GroupFormer(peer_id, cfg, self.exchange, admission, self.averager, client_mode,
                                  view=lambda: self.view, rules=self.rules, stop=self._stop, now=self.now,
                                  plan=lambda view, now: board_group_of(view, now, self.facts(), self.plan_rules))
        self.runner = RoundRun(peer_id, cfg, self.former, self.reduction, self.shared.copy, self._flag,
                               self.tally.note_credits, on_sent, part_signing(run_id, peer_id, record_key, admission)
                               if on_sent is not None and record_key is not None else None)
        self._publisher.start()

    # ---- the strategy's, called on the main thread -----------------------------------------------------------
    def local_step(self) -> None:
        """After backward: the strategy's local step (DiLoCo: the inner optimizer's)."""
        self.strategy.local_step()

    def outer_lr(self) -> Optional[float]:
        return self.strategy.outer_lr()

    @property
    def round(self) -> int:
        return self.at.round

    # ---- progress board ------------------------------------------------------------------------------------------
    @property
    def view(self) -> BoardView:
        """The progress board as of the publisher's last read. Take it once and judge from that value: the
        publisher replaces it whole while a round runs."""
        return self._publisher.view

    def _reads_paused(self) -> bool:
        """A kept group's member reads no board until its meeting of this round failed (scheduler.reads_paused)."""
        return reads_paused(kept_group_of(self.view, self.facts(), self.plan_rules) is not None,
                            self.former.met_round == self.at.round)

    def facts(self, waiter: Optional[str] = None) -> RoundFacts:
        """This peer's round as values, for the scheduler's decisions (cotrain.averaging.scheduler)."""
        at = self.at
        return RoundFacts(self.progress(), at.reached_h_at, self.former.met_round, at.retry_at, at.reread_after,
                          at.kept, tuple(self.stats.last_group), waiter)

    def progress(self, phase: Phase = Phase.TRAIN) -> PeerProgress:
        return self.at.progress(self.peer_id, phase, self.now(), reducer=not self.client_mode,
                                contributed=self.tally.contributed)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Shown as paused on the board while the node takes no steps (its owner uses the machine, or it waits for a
        work unit): a peer that takes no steps must not be planned into a group or waited for."""
        before, self.phase = self.phase, Phase.PAUSED
        try:
            yield
        finally:
            self.phase = before

    def wait_for_peers(self, count: int, timeout: float, stop: Optional[threading.Event] = None) -> int:
        """Wait until ``count`` peers (ourselves included) are on the board (BoardPublisher.wait_for_peers)."""
        return self._publisher.wait_for_peers(count, timeout, self.rules, stop)

    # ---- rounds --------------------------------------------------------------------------------------------------
    def _start_round(self, mid_round: bool) -> None:
        self.at.begin(self.tally.round_clock(), mid_round)

    def after_local_step(self, samples: int) -> Optional[Decision]:
        """Account one local step; end the round when the swarm is ready. Returns the decision unless TRAIN."""
        now = self.now()
        if self.at.step(samples, now, self.cfg.inner_steps) and self.sharded:
            self._publisher.wake()  # read the shard afresh for the early meeting (see scheduler.meets_early)
        pending = self._pending
        if pending is not None:
            if not pending.future.done() and self.at.steps < self.cfg.inner_steps:
                return None  # the round's all-reduce runs on while we train
            self._finish_round(pending, pending.result())  # waits once the next round's steps are taken
            now = self.now()
        view = self.view  # every test of this step judges the same read
        plan = next_plan(view, now, self.facts(waiter=self._waited_for(view)), self.plan_rules)
        if view_stale(view, self.sharded, self.at.round):  # read the new round's shard at once
            self._publisher.wake()
        if plan.move is Move.TRAIN:
            return None
        self.stats.last_reason = plan.reason
        self._news.info(plan.reason, "round %d: %s", self.at.round, plan.reason)
        if plan.move is Move.RESYNC:
            self._resync()
            return Decision(Action.RESYNC, plan.reason)
        self._average(plan.early, announce=plan.announce)
        return Decision(Action.AVERAGE, plan.reason)

    def _waited_for(self, view: BoardView) -> Optional[str]:
        """A peer of this round that asked for this peer's meeting in the last second while it had none out (it was
        training): the peer waits at the meeting, for its host or (its view made us the host) as a walk-in. The board
        would tell it a read or two later (at 32 nodes, reads every 4 s: members waited for a host that was
        training, 99 times in one run); the request tells it at once. -> the peer's id, or None."""
        # awaiting a read: our view failed a meeting, and the same view would fail again
        if (self.cfg.group_formation == "matchmaking" or self.at.steps == 0 or self._pending is not None
                or awaiting_read(view, self.now(), self.at.reread_after, self.rules)):
            return None
        askers = self.exchange.askers(meeting_key(self.at.round), within_s=1.0)
        return min(askers) if askers else None

    def _resync(self, prefer: Sequence[str] = (), min_round: int = 0) -> None:
        self.stats.resyncs += 1
        if not self.state.download(prefer=prefer, min_round=min_round):
            self.at.retry_at = self.now() + self.cfg.matchmaking_time

    def _average(self, early: bool = False, announce: bool = True) -> None:
        """End the round: average this peer's contribution with a group (in the background with
        ``averaging.overlap``). ``early``: the meeting of a peer that just took its H steps; if the round's peers do
        not all come, train on (no matchmaking, no retry delay). ``announce``: tell the round's peers on the board
        (not when a groupmate already waits at the meeting: it knows)."""
        contribution = self.strategy.contribution()
        view = self.view
        live = live_peers(board_time(view, self.now(), self.rules), self.progress(), view.peers, self.rules)
        peers_here = [p for p in live if p.round == self.at.round]
        if not live and kept_group_of(view, self.facts(), self.plan_rules) is None:
            swarm = self.tally.swarm_view()  # before our own samples join the ledger: they are the round's
            self.tally.count_own(self.at.samples, self.at.round + 1)
            self._apply_and_advance(contribution, group_size=1, clock=self.at.clock, swarm=swarm,
                                    added=self.at.samples)
            return
        self.phase = Phase.AVERAGE
        if not early and announce:
            # tell the round's peers at once that it ends (round_decision: "peer X began averaging"). Not for the
            # early meeting: its groupmates come to it when they take their own H steps, signal or none; and one
            # DHT store a round, to every replica, took a quarter of the CPU of a 4-node swarm's rounds on 2 cores
            # (bench/rounds.py, 0.10 MB: 166-181 ms a round with it, 114-139 without). The publisher's next record
            # carries the phase anyway
            self.board.publish(self.progress(self.phase))
        if self._worker is None:
            self._average_with_group(contribution, len(peers_here) + 1, early)
            return
        launch = self._launch(contribution, early, len(peers_here) + 1)
        launch.held = self.strategy.hold_round(launch)
        self._start_round(mid_round=False)
        launch.future = self._worker.submit(self._run, launch)
        self._pending = launch

    def _average_with_group(self, contribution: list[torch.Tensor], seen: int, early: bool = False) -> RoundResult:
        """One round with a group, here and now (no overlap), from ``contribution`` and this round's counters."""
        launch = self._launch(contribution, early, seen)
        result = self._run(launch)
        self._finish_round(launch, result)
        return result

    def _launch(self, contribution: list[torch.Tensor], early: bool, seen: int) -> PendingRound:
        """The round as it ends here: its counters, its clock and the counts this peer says at the meeting."""
        at = self.at
        return PendingRound(at.round, at.steps, at.samples, at.reached_h_at, contribution, early, seen,
                            clock=at.clock, swarm=self.tally.swarm_view(), contributed=self.tally.contributed,
                            claimed=int(min(at.samples * self.overclaim, 1 << 40)))

    def _run(self, launch: PendingRound) -> RoundResult:
        return self.runner.run(launch, self.state.hash)

    def _finish_round(self, launch: PendingRound, result: RoundResult) -> None:
        """Act on a round's result, on the main thread, between two local steps."""
        overlapped = launch.future is not None
        self._pending = None
        self.phase = Phase.TRAIN
        at = self.at
        self.stats.counted(result, kept_group(at.kept, launch.round, self.cfg.group_rounds) is not None)
        if result.kind in (Kind.APPLY, Kind.RESYNC):  # our samples are in the group's average either way
            self.tally.credit_round(result, launch, at.round + 1)
            # a member that downloads the group's new state after the round is as much of the group as the others
            at.kept = (launch.round, sorted({self.peer_id, *result.group})) if result.from_board else None
            if result.partial:
                logger.warning("round %d: %s", launch.round, result.reason)
        if result.kind is Kind.APPLY:
            self._apply_and_advance(result.average, result.group_size, carried=launch if overlapped else None,
                                    state=result.state, clock=launch.clock, swarm=result.swarm, added=result.samples)
            return
        if result.kind is Kind.RESYNC:
            logger.warning("round %d: %s", launch.round, result.reason)
            self._resync(prefer=result.donors, min_round=launch.round + 1)
            return
        if overlapped:  # the round did not happen: the node takes back what it had set aside for it
            at.take_back(launch)
            self.strategy.give_back_round(launch)
        if kept_group(at.kept, launch.round, self.cfg.group_rounds) is not None:
            self._publisher.wake()  # a kept group's meeting failed: its members read the board again, at once
        if result.kind is Kind.UNFILLED:  # the former said why; train on, round_decision says when to try again
            return
        self.stats.last_reason = f"round {launch.round}: {result.reason}; training on and retrying"
        if result.reread:  # views of the board differ while peers come and go: expected, and over at the next read
            self._news.info(result.reason, "%s after the next read of the board", self.stats.last_reason)
            at.reread_after = self.now()
            return
        logger.warning("%s", self.stats.last_reason)
        at.retry_at = self.now() + self.cfg.matchmaking_time

    def _flag(self, round_number: int, dropped: Mapping[str, str]) -> None:
        for peer, why in dropped.items():
            if "did not arrive" not in why:  # a late peer is slow, not bad
                logger.warning("round %d: dropped the contribution of peer %s: %s", round_number, peer[-8:], why)
                self.stats.flag(peer, why)

    def _apply_and_advance(self, average: list[torch.Tensor], group_size: int, *, clock: RoundClock, swarm: int,
                           added: int, carried: Optional[PendingRound] = None,
                           state: Optional[list] = None) -> None:
        """Apply a round's average; the swarm's count becomes ``swarm`` (the group's agreed count before the round)
        plus the round's ``added`` samples (the group's). ``clock``: the round's, whose start sets the outer step's
        lr under ``schedule.outer`` (one lr for the whole group).
        ``carried``: with overlap, the round the average is of; the local steps taken since are kept (the round's
        counters already count them). ``state``: the group's average of its members' shared states, taken first."""
        if self.outer_lr_at is not None:
            self.strategy.set_outer_lr_factor(self.outer_lr_at(clock.base))
        self.stats.applied(self.at.round, group_size, states_averaged=state is not None)
        self.state.apply(average, carried, state, swarm, added)
        self._news.info("round done", "round %d done with %d peer(s): now at round %d", self.at.round - 1,
                        group_size, self.at.round)
        if carried is None:
            self.strategy.discard_round()
            self._start_round(mid_round=False)

    def shutdown(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:  # let the groupmates have our part of a round in flight; its result is dropped
            try:
                pending.future.result(timeout=self.cfg.allreduce_timeout)
            except Exception:  # noqa: BLE001 - late or failed: the groupmates leave it out, as for any late peer
                pass
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)
        self._stop.set()
        self._publisher.stop()
        try:  # tell the peers at once that we are gone, rather than letting our record expire
            self.board.publish(self.progress(Phase.LEFT))
        except Exception as e:  # noqa: BLE001 - the record then expires by itself within its TTL
            logger.warning("could not announce leaving on the progress board (%r); the record expires by itself", e)
        self.shared.shutdown()
        self.ports.shutdown()


def part_signing(run_id: str, peer_id: str, record_key, admission: Admission) -> Callable[[int], PartSigning]:
    """A round's signing of this peer's parts with its record key, and checking of its groupmates' with the record
    keys their credentials name (verification: the evidence bound to what the group took in)."""
    return lambda round_number: PartSigning(run_id, round_number, peer_id, record_key, admission.record_key)
