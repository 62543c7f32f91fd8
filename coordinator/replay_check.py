"""The validator's replay of a round (cotrain.verification.replay): the node's local steps run again from the trace
its evidence carries, on the bytes of its own work units, must lead to the contribution it sent.

A replay costs one round of a node's training on the coordinator's CPU, so only some checks make one: those the
validator says are due (a node's first, and those of a node on probation after a failed check), and a share
``verification.replay_rate`` of the others, drawn after the cheaper checks passed, where no node can predict it.
"""

from __future__ import annotations

import logging
import random
from typing import Callable, Optional, Sequence

from cotrain.config import RunConfig
from cotrain.verification import score as scoring
from cotrain.verification.evidence import Evidence, TraceDecoder
from cotrain.verification.replay import START_SLACK, Replayer, judge, not_replayable
from cotrain.verification.trace import MAX_STEPS, TraceError

logger = logging.getLogger(__name__)

REPLAY = "replay"
READS = "reads"
#: a round whose dropout drew from a GPU's generator, replayed on this CPU: its masks differ, so a mismatch says
#: nothing (weighs nothing in the reputation)
ELSEWHERE = "replayed_elsewhere"


class ReplayCheck:
    """Replays a share ``verification.replay_rate`` of the rounds it is asked about. ``read(offset, length)``: bytes
    of the training split."""

    def __init__(self, cfg: RunConfig, read: Callable[[int, int], bytes], rng: random.Random):
        self.rate, self.rng = cfg.verification.replay_rate, rng
        #: why this run's rounds are never replayed ("" when they are)
        self.why_not = "replay_rate is 0" if self.rate <= 0 else not_replayable(cfg)
        self.replayer = Replayer(cfg, read) if not self.why_not else None
        self.slack = START_SLACK.get(cfg.compression.kind, 0.0)
        self.dropout = cfg.model.dropout > 0
        if self.why_not and self.rate > 0:
            logger.info("validator: rounds are not replayed: %s", self.why_not)

    @property
    def decoder(self) -> Optional[TraceDecoder]:
        return self.replayer.decode if self.replayer is not None else None

    @property
    def max_bytes(self) -> int:
        return self.replayer.max_trace_bytes(MAX_STEPS) if self.replayer is not None else 0

    def drawn(self, due: bool = False) -> bool:
        """Whether this check replays: always when ``due`` (the validator's call), else with ``replay_rate``."""
        return self.replayer is not None and (due or self.rng.random() < self.rate)

    def check(self, ev: Evidence, given: Sequence[tuple[int, int]]) -> scoring.Score:
        """The replay's verdict on ``ev``, whose node was given the byte ranges ``given`` (merged)."""
        trace = ev.trace
        if trace is None:
            return scoring.Score("fail", "the evidence carries no trace of the round to replay", REPLAY)
        for i, step in enumerate(trace.steps):
            outside = next(((a, b) for a, b in step.rows if not any(c <= a and b <= d for c, d in given)), None)
            if outside is not None:
                return scoring.Score("fail", f"evidence.trace.steps[{i}].rows: bytes [{outside[0]}, {outside[1]}) "
                                     "are in no work unit this node was given", READS)
        try:
            replayed = self.replayer.replay(trace)
        except TraceError as e:
            return scoring.Score("fail", str(e), scoring.MALFORMED)
        verdict = judge(ev.contribution, ev.params, trace, replayed, self.slack)
        if verdict.passed:
            return scoring.Score("pass", f"replayed {len(trace.steps)} steps: {verdict.reason}")
        if trace.device != "cpu" and self.dropout:
            return scoring.Score("fail", f"replayed {len(trace.steps)} steps of a GPU's round on a CPU, whose dropout "
                                 f"masks differ: inconclusive ({verdict.reason})", ELSEWHERE)
        return scoring.Score("fail", f"replayed {len(trace.steps)} steps: {verdict.reason}", REPLAY)
