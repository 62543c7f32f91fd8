"""What a node reports about itself: the figures its training loop keeps (:class:`Metrics`), the heartbeat's
``NodeMetrics`` taken from them and from the averager's snapshot (:func:`node_metrics`), and what its status file
holds (:func:`status_figures`)."""

from __future__ import annotations

import math
import os
import threading
import time

from cotrain.averaging import Admission, RoundAverager
from cotrain.footprint import Footprint, cpu_seconds
from cotrain.status import message_to_dict
from cotrain.v1 import coordinator_pb2 as pb


class Metrics:
    """What the heartbeat reports, updated by the training loop."""

    def __init__(self):
        self.lock = threading.Lock()
        self.step = 0
        self.loss = math.nan
        self.samples_total = 0
        self.samples_per_s = 0.0
        self.epoch = 0
        self.compute_s = 0.0
        self.started = time.monotonic()
        self._window: list[tuple[float, int]] = []
        self.footprint = Footprint()  # the node's processes, as last measured
        self.heartbeat_ms = 0.0  # the previous heartbeat's round trip
        self.lr = math.nan  # the inner lr of the last step
        self.lr_samples = 0.0  # where the last step stood on the run's schedule (the swarm's samples)
        self.skipped_steps = 0  # steps left out: too few of a hosted mixture's experts answered

    def update(self, loss: float, samples: int, compute_s: float, lr: float = math.nan, at: float = 0.0) -> None:
        now = time.monotonic()
        with self.lock:
            self.step += 1
            self.lr, self.lr_samples = lr, at
            self.compute_s += compute_s
            self.samples_total += samples
            if math.isfinite(loss):
                self.loss = loss if not math.isfinite(self.loss) else 0.9 * self.loss + 0.1 * loss
            self._window.append((now, self.samples_total))
            while len(self._window) > 2 and now - self._window[0][0] > 20.0:
                self._window.pop(0)
            (t0, s0), (t1, s1) = self._window[0], self._window[-1]
            self.samples_per_s = (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


def node_metrics(m: Metrics, a: RoundAverager, units_done: int, admission: Admission,
                 expert_calls_failed: int = 0) -> pb.NodeMetrics:
    """The heartbeat's figures: the training loop's (under its lock) and the averager's (a snapshot of its stats);
    ``expert_calls_failed``: a hosted mixture's trainer's."""
    s = a.stats.snapshot()
    with m.lock:
        return pb.NodeMetrics(step=m.step, round=a.round, loss=m.loss, samples_per_s=m.samples_per_s,
                              bytes_sent=a.exchange.bytes_sent, bytes_received=a.exchange.bytes_received,
                              samples_total=a.tally.samples_total, epoch=m.epoch,
                              partial_rounds=s.partial_rounds, rounds_completed=s.rounds_completed,
                              samples_local=m.samples_total, compute_s=m.compute_s,
                              groups_from_board=s.groups_from_board, groups_matchmade=s.groups_matchmade,
                              meet_s=s.meet_s, allreduce_s=s.allreduce_s,
                              wall_s=time.monotonic() - m.started,
                              state_bytes_sent=a.exchange.state_bytes_sent,
                              state_bytes_received=a.exchange.state_bytes_received, peer_id=a.peer_id,
                              flagged_peers=sorted(s.flagged)[:32], units_done=units_done,
                              refused=admission.refused,
                              refused_peers=sorted(admission.refused_peers)[:32],
                              memory_bytes=m.footprint.pss_bytes, processes=m.footprint.processes,
                              heartbeat_ms=m.heartbeat_ms, last_group=list(s.last_group[:64]), lr=m.lr,
                              steps_skipped=m.skipped_steps, expert_calls_failed=expert_calls_failed)


def status_figures(metrics: pb.NodeMetrics, m: Metrics, a: RoundAverager) -> dict:
    """What ``STATE_DIR/status.json`` holds (:class:`~cotrain.node.status_file.StatusFile`, due at every new round
    and every ``log_every_s``, written at most twice a second): the heartbeat's figures, when, and the CPU seconds this
    process took (``cpu_s``) and with what it started (``cpu_tree_s``: its DHT process and libp2p daemon), read with
    the figures: a bench divides them by the rounds between two snapshots."""
    own, tree = cpu_seconds(os.getpid())
    with m.lock:  # one step's pair: ``metrics`` was read before, and the training loop has taken steps since
        lr, lr_samples = m.lr, m.lr_samples
    return dict(message_to_dict(metrics), time=time.time(), pid=os.getpid(), cpu_s=own, cpu_tree_s=tree,
                lr=lr, lr_samples=lr_samples, contributed=a.tally.contributed, swarm_view=a.tally.swarm_view())
