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

:class:`RoundAverager` is the front: it keeps the round's counters and the shared state, and changes them only on
the node's main thread. It asks :mod:`cotrain.averaging.scheduler` when a round ends, and hands the round to
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
from cotrain.averaging.overlap import PendingRound
from cotrain.averaging.reduction import Reduction
from cotrain.averaging.round_run import RoundRun
from cotrain.averaging.round_stats import RoundStats
from cotrain.averaging.scheduler import (Move, RoundFacts, Rules, board_group_of, kept_group_of, next_plan,
                                         reads_paused)
from cotrain.averaging.progress import (Action, Decision, PeerProgress, Phase, RoundRules, live_peers)
from cotrain.averaging.state import STATE_KEY, Progress
from cotrain.averaging.shared_state import SharedState
from cotrain.averaging.state_source import StateSource
from cotrain.averaging.strategy import Strategy
from cotrain.averaging.tally import Tally
from cotrain.checkpoint import Checkpoint, shared_tensors_of
from cotrain.config import AveragingConfig, CompressionConfig
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
                 ports: Optional[Ports] = None):
        """``ports``: the board, exchange and matchmaker this peer's rounds use (cotrain.averaging.ports); None: a
        node's, built on ``dht``."""
        self.strategy, self.dht, self.cfg, self.run_id = strategy, dht, cfg, run_id
        #: nobody can dial this peer: it reduces no part of an all-reduce (its groupmates behind NAT could not
        #: fetch it)
        self.client_mode = client_mode
        self.compression, self.peer_id = compression, peer_id
        self.params = [p for p in model.parameters()]
        self.param_names = [n for n, _ in model.named_parameters()]
        #: a bench's liar: it says this many times the samples it trained on (honest peers: 1)
        self.overclaim = max(1.0, float(overclaim))
        self.round = 0
        self.rules = RoundRules(cfg.inner_steps, cfg.round_wait, stale_after=3 * cfg.progress_interval + 1.0)
        self.admission = admission
        self.ports = ports or Ports.over_dht(dht, run_id, cfg, admission, ttl=self.rules.stale_after,
                                             record_key=record_key, client_mode=client_mode, upload_bps=upload_bps)
        #: the swarm's time (cotrain.averaging.clock): a record's time, a round's start, the board's ages
        self.now = self.ports.clock.now
        #: the time this peer came to its round (published as PeerProgress.since: a sharded board's groups are cut in
        #: the order the peers came)
        self.round_since = self.now()
        #: where this peer stands on the swarm's clock: the swarm's samples, its own, every peer's as last seen
        self.tally = Tally.for_run(peer_id, cfg.inner_steps, step_samples)
        #: the run's batch: a local step's samples before any round set the pace
        self.step_samples = step_samples
        #: schedule.outer: the outer step's lr factor at the swarm's samples, taken at the applied round's clock
        self.outer_lr_at = outer_lr_at
        #: where this round's local steps stand on the run's schedule (set when the round's steps begin)
        self.clock = RoundClock(first_step=step_samples, inner_steps=cfg.inner_steps)
        self.steps_in_round = 0
        self.samples_in_round = 0
        self.mid_round = False
        self.reached_h_at: Optional[float] = None
        self.retry_at = 0.0
        #: a round failed because a groupmate planned another group: the next try waits for a board read begun after
        #: this time (see board_view.awaiting_read)
        self._reread_after = 0.0
        #: (round, its group: every member, this peer included) of the last round this peer's group met at on the
        #: board: the plan of the next round within averaging.group_rounds (see scheduler.kept_group_of)
        self._kept: Optional[tuple[int, list[str]]] = None
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
        self.exchange.provide(STATE_KEY, self.state_bytes)
        #: a meeting's members join its host with their meetings (a hosted round's contribution riding on them)
        self.exchange.max_deposit_bytes = meeting_piece_bound(self.reduction.deposit_bound())
        #: where this peer takes the shared state from when it joins or falls behind
        self.source = StateSource(self.exchange, peer_id, run_id, view=lambda: self.view,
                                  read_all=self.board.read_all,
                                  wait_for_read=lambda timeout: self._publisher.wait_for_read(timeout=timeout),
                                  sharded=self.sharded, stale_after=self.rules.stale_after,
                                  progress_interval=cfg.progress_interval, retry_wait_s=cfg.matchmaking_time,
                                  stop=self._stop, now=self.now)
        #: who averages in a round, and the round's network side from its launch to its result
        self.former = GroupFormer(peer_id, cfg, self.exchange, admission, self.averager, client_mode,
                                  view=lambda: self.view, rules=self.rules, stop=self._stop, now=self.now,
                                  plan=lambda view, now: board_group_of(view, now, self.facts(), self.plan_rules))
        self.runner = RoundRun(peer_id, cfg, self.former, self.reduction, self.shared.copy, self._flag,
                               self.tally.note_credits)
        self._publisher.start()

    # ---- the strategy's, called on the main thread -----------------------------------------------------------
    def shared_tensors(self) -> list[torch.Tensor]:
        return self.strategy.shared_tensors()

    def local_step(self) -> None:
        """After backward: the strategy's local step (DiLoCo: the inner optimizer's)."""
        self.strategy.local_step()

    def outer_lr(self) -> Optional[float]:
        return self.strategy.outer_lr()

    # ---- progress board ------------------------------------------------------------------------------------------
    @property
    def view(self) -> BoardView:
        """The progress board as of the publisher's last read. Take it once and judge from that value: the
        publisher replaces it whole while a round runs."""
        return self._publisher.view

    def _reads_paused(self) -> bool:
        """A kept group's member reads no board until its group's meeting of this round failed: the group meets from
        its roster (see scheduler.kept_group_of), and the view would go unused (a peer ahead is not followed while the
        group holds, and a deal's first round reads its new shard afresh anyway, see board_view.view_stale). It goes
        on publishing its record. Every read is a DHT traversal that the replicas it visits answer, and at 32 nodes
        on a sixteenth of a core each the DHT process and libp2p daemon took 0.031 CPUs of a node's 0.056, its
        training 0.024 (bench/scale.py, /proc over 40 s); at 4 nodes 0.014 and 0.037."""
        return reads_paused(kept_group_of(self.view, self.facts(), self.plan_rules) is not None,
                            self.former.met_round == self.round)

    def facts(self, waiter: Optional[str] = None) -> RoundFacts:
        """This peer's round as values, for the scheduler's decisions (cotrain.averaging.scheduler)."""
        return RoundFacts(self.progress(), self.reached_h_at, self.former.met_round, self.retry_at, self._reread_after,
                          self._kept, tuple(self.stats.last_group), waiter)

    def progress(self, phase: Phase = Phase.TRAIN) -> PeerProgress:
        return PeerProgress(self.peer_id, self.round, self.steps_in_round, self.samples_in_round, phase,
                            self.mid_round, self.now(), reducer=not self.client_mode, since=self.round_since,
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

    # ---- shared state --------------------------------------------------------------------------------------------
    @property
    def state_hash(self) -> str:
        """The hash of the shared state as it is now: the same on every member of a group after a round."""
        return self.shared.hash()

    def _metadata(self) -> dict:
        return dict(round=self.round, **self.tally.to_metadata())

    def get_state(self) -> tuple[dict, list[torch.Tensor]]:
        return self.shared.snapshot(self._metadata)

    def state_bytes(self) -> bytes:
        """The shared state as a peer downloads it (checkpoint format)."""
        return self.shared.encoded(self._metadata)

    def set_state(self, metadata: dict, tensors: Sequence[torch.Tensor]) -> None:
        """Take a downloaded state (raises ValueError naming what does not fit). With only the model's parameters (a
        checkpoint a coordinator made, e.g. by shrink and perturb), the strategy's own state starts afresh,
        identically on every peer."""
        params_only = self.shared.check(metadata, tensors)
        self.shared.settle()
        with torch.no_grad(), self.shared.lock:
            self.shared.write(tensors, params_only)
            self.round = int(metadata["round"])
            self.round_since = self.now()
            self.tally.take(metadata)
            self.strategy.load_shared_metadata(metadata)
        self.strategy.after_shared_change()
        self.strategy.discard_round()
        self.reduction.error = None
        self.shared.changed()
        self._start_round(mid_round=True)
        logger.info("took the shared state of round %d (state %s)", self.round, self.state_hash)

    def load_checkpoint(self, ckpt: Checkpoint) -> None:
        self.set_state(ckpt.metadata, shared_tensors_of(ckpt, self.param_names))

    def load_state_from_peers(self, timeout: float = 30.0, on_progress: Optional[Progress] = None,
                              prefer: Sequence[str] = (), min_round: int = 0) -> bool:
        """Download the shared state from the peer with the most progress; False when no peer has any.
        ``prefer``: peers to take it from first, once they hold round ``min_round`` (the groupmates whose state is
        the group's, after a round this peer's state differed in: they apply the round's average at their next
        step, so their state is asked for again for up to ``matchmaking_time``); then as without."""
        if prefer and self._take(self.source.from_groupmates(prefer, min_round, timeout)):
            return True
        return self._take(self.source.from_the_swarm(timeout, on_progress))

    def _take(self, ckpt: Optional[Checkpoint]) -> bool:
        if ckpt is None:
            return False
        try:
            self.load_checkpoint(ckpt)
        except (ValueError, KeyError, TypeError) as e:
            logger.warning("ignoring downloaded state: %s", e)
            return False
        return True

    # ---- rounds --------------------------------------------------------------------------------------------------
    def _start_round(self, mid_round: bool) -> None:
        self.clock = RoundClock(self.tally.samples_total, self.tally.round_samples, self.cfg.inner_steps,
                                self.step_samples)
        self.steps_in_round = 0
        self.samples_in_round = 0
        self.mid_round = mid_round
        self.reached_h_at = None

    def after_local_step(self, samples: int) -> Optional[Decision]:
        """Account one local step; end the round when the swarm is ready. Returns the decision unless TRAIN."""
        self.steps_in_round += 1
        self.samples_in_round += samples
        now = self.now()
        if self.steps_in_round >= self.cfg.inner_steps and self.reached_h_at is None:
            self.reached_h_at = now
            if self.sharded:  # read the shard afresh for the early meeting (see scheduler.meets_early)
                self._publisher.wake()
        pending = self._pending
        if pending is not None:
            if not pending.future.done() and self.steps_in_round < self.cfg.inner_steps:
                return None  # the round's all-reduce runs on while we train
            self._finish_round(pending, self._result_of(pending))  # waits once the next round's steps are taken
            now = self.now()
        view = self.view  # every test of this step judges the same read
        plan = next_plan(view, now, self.facts(waiter=self._waited_for(view)), self.plan_rules)
        if view_stale(view, self.sharded, self.round):  # read the new round's shard at once
            self._publisher.wake()
        if plan.move is Move.TRAIN:
            return None
        self.stats.last_reason = plan.reason
        self._news.info(plan.reason, "round %d: %s", self.round, plan.reason)
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
        if (self.cfg.group_formation == "matchmaking" or self.steps_in_round == 0 or self._pending is not None
                or awaiting_read(view, self.now(), self._reread_after, self.rules)):
            return None
        askers = self.exchange.askers(meeting_key(self.round), within_s=1.0)
        return min(askers) if askers else None

    def _resync(self, prefer: Sequence[str] = (), min_round: int = 0) -> None:
        self.stats.resyncs += 1
        if not self.load_state_from_peers(prefer=prefer, min_round=min_round):
            self.retry_at = self.now() + self.cfg.matchmaking_time

    def _average(self, early: bool = False, announce: bool = True) -> None:
        """End the round: average this peer's contribution with a group (in the background with
        ``averaging.overlap``). ``early``: the meeting of a peer that just took its H steps; if the round's peers do
        not all come, train on (no matchmaking, no retry delay). ``announce``: tell the round's peers on the board
        (not when a groupmate already waits at the meeting: it knows)."""
        contribution = self.strategy.contribution()
        view = self.view
        live = live_peers(board_time(view, self.now(), self.rules), self.progress(), view.peers, self.rules)
        peers_here = [p for p in live if p.round == self.round]
        if not live and kept_group_of(view, self.facts(), self.plan_rules) is None:
            swarm = self.tally.swarm_view()  # before our own samples join the ledger: they are the round's
            self.tally.count_own(self.samples_in_round, self.round + 1)
            self._apply_and_advance(contribution, group_size=1, clock=self.clock, swarm=swarm,
                                    added=self.samples_in_round)
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
        return PendingRound(self.round, self.steps_in_round, self.samples_in_round, self.reached_h_at, contribution,
                            early, seen, clock=self.clock, swarm=self.tally.swarm_view(),
                            contributed=self.tally.contributed,
                            claimed=int(min(self.samples_in_round * self.overclaim, 1 << 40)))

    def _run(self, launch: PendingRound) -> RoundResult:
        return self.runner.run(launch, self.state_hash)

    def _result_of(self, pending: PendingRound) -> RoundResult:
        try:
            return pending.future.result()
        except Exception as e:  # noqa: BLE001 - a bug in the round's thread: the round fails, the node goes on
            logger.error("round %d: the averaging thread failed", pending.round, exc_info=e)
            return RoundResult(Kind.FAILED, f"the averaging thread failed ({e!r})")

    def _finish_round(self, launch: PendingRound, result: RoundResult) -> None:
        """Act on a round's result, on the main thread, between two local steps."""
        overlapped = launch.future is not None
        self._pending = None
        self.phase = Phase.TRAIN
        self.stats.counted(result, kept_group(self._kept, launch.round, self.cfg.group_rounds) is not None)
        added = result.samples  # the group's samples as credited: the same figure on every member
        if result.kind in (Kind.APPLY, Kind.RESYNC):  # our samples are in the group's average either way
            self.tally.count_own(dict(result.contributed).get(self.peer_id, launch.contributed + launch.samples)
                                 - launch.contributed, self.round + 1)  # our samples as the group credited them
            self.tally.observe((peer, launch.round + 1, count) for peer, count in result.contributed
                                 if peer != self.peer_id)
            if result.kind is Kind.RESYNC:  # the state it downloads next brings its count; should that fail, this
                self.tally.advance(result.swarm, added)
            # a member that downloads the group's new state after the round is as much of the group as the others
            self._kept = (launch.round, sorted({self.peer_id, *result.group})) if result.from_board else None
            if result.partial:
                logger.warning("round %d: %s", launch.round, result.reason)
        if result.kind is Kind.APPLY:
            self._apply_and_advance(result.average, result.group_size, carried=launch if overlapped else None,
                                    state=result.state, clock=launch.clock, swarm=result.swarm, added=added)
            return
        if result.kind is Kind.RESYNC:
            logger.warning("round %d: %s", launch.round, result.reason)
            self._resync(prefer=result.donors, min_round=launch.round + 1)
            return
        if overlapped:  # the round did not happen: the node takes back what it had set aside for it
            self.steps_in_round, self.samples_in_round, self.reached_h_at = launch.give_back(
                self.steps_in_round, self.samples_in_round, self.reached_h_at)
            self.strategy.give_back_round(launch)
        if kept_group(self._kept, launch.round, self.cfg.group_rounds) is not None:
            self._publisher.wake()  # a kept group's meeting failed: its members read the board again, at once
        if result.kind is Kind.UNFILLED:  # the former said why; train on, round_decision says when to try again
            return
        self.stats.last_reason = f"round {launch.round}: {result.reason}; training on and retrying"
        if result.reread:  # views of the board differ while peers come and go: expected, and over at the next read
            self._news.info(result.reason, "%s after the next read of the board", self.stats.last_reason)
            self._reread_after = self.now()
            return
        logger.warning("%s", self.stats.last_reason)
        self.retry_at = self.now() + self.cfg.matchmaking_time

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
        self.shared.settle()
        if self.outer_lr_at is not None:
            self.strategy.set_outer_lr_factor(self.outer_lr_at(clock.base))
        with torch.no_grad(), self.shared.lock:
            if state is not None:
                for dst, src in zip(self.shared.tensors(), state):
                    dst.copy_(src.to(dst.device, dst.dtype))
                self.stats.states_averaged += 1
            self.strategy.apply(average, carried, self.reduction.take_residual(), self.reduction.feedback.decay)
            self.tally.advance(swarm, added)
            self.stats.applied(self.round, group_size)
            self.round += 1
            self.round_since = self.now()
        # hashed while the node takes its next local step: the next round's meeting reads it
        self.shared.changed()
        self._news.info("round done", "round %d done with %d peer(s): now at round %d", self.round - 1, group_size,
                        self.round)
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

