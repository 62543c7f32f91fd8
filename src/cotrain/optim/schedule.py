"""The run's learning-rate schedule, a pure function of the swarm's progress.

Every node computes its lr from the samples the whole swarm has trained on, never from its own step count: a node
that joins at round 500 takes round 500's lr, and a GPU node that takes 50x the steps of a CPU node does not run
through the schedule 50x faster. Where a step stands on the schedule is a :class:`RoundClock`: built from values
every member of a round agrees on (the shared state's count when the round began, and the samples the round before
added), so every member applies the same lr at the same local step. The same function drives the outer step's lr
where the run asks for it (``schedule.outer``), at the round's start: one lr for the whole group.

Shapes (``schedule.kind``), each after a linear warmup over ``warmup_samples``:

- ``constant``: the peak lr for ever.
- ``cosine``: from the peak to ``min_lr`` over ``horizon_samples`` (a run of known length), ``min_lr`` after it.
- ``wsd`` (warmup-stable-decay): the peak until ``cooldown_fraction`` of the horizon is left, then linearly to
  ``min_lr`` (a run of known length that keeps the peak longer than a cosine does).
- ``inverse_sqrt``: the peak until ``timescale_samples``, then ``peak * sqrt(timescale / samples)``, never below
  ``min_lr``: needs no horizon, for open-ended runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("constant", "cosine", "wsd", "inverse_sqrt")


@dataclass(frozen=True)
class Schedule:
    kind: str = "constant"
    #: the run's length in samples (all nodes together); 0: open-ended
    horizon_samples: int = 0
    warmup_samples: int = 0
    #: the lowest factor of the peak lr (min_lr / lr)
    min_ratio: float = 0.1
    #: wsd: the part of the horizon spent cooling down
    cooldown_fraction: float = 0.2
    #: inverse_sqrt: where the decay starts
    timescale_samples: int = 0

    @classmethod
    def from_config(cls, cfg) -> "Schedule":
        """From a :class:`cotrain.config.RunConfig` (its ``schedule`` and ``optimizer`` sections)."""
        s, opt = cfg.schedule, cfg.optimizer
        return cls(kind=s.kind, horizon_samples=s.horizon_samples, warmup_samples=s.warmup_samples,
                   min_ratio=opt.min_lr / opt.lr, cooldown_fraction=s.cooldown_fraction,
                   timescale_samples=s.timescale_samples)

    def problems(self) -> list[str]:
        """What makes no sense in this schedule, each naming its field; empty when it can be used."""
        out = []
        if self.kind not in KINDS:
            out.append(f"schedule.kind: one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.horizon_samples < 0:
            out.append(f"schedule.horizon_samples: must be > 0, or 0 for an open-ended run, got {self.horizon_samples}")
        if self.kind in ("cosine", "wsd") and self.horizon_samples <= 0:
            out.append(f"schedule.horizon_samples: a {self.kind} schedule needs the run's horizon (> 0); an "
                       f"open-ended run takes kind = \"inverse_sqrt\" (or \"constant\")")
        if self.warmup_samples < 0:
            out.append(f"schedule.warmup_samples: must be >= 0, got {self.warmup_samples}")
        if self.horizon_samples > 0 and self.warmup_samples >= self.horizon_samples:
            out.append(f"schedule.warmup_samples ({self.warmup_samples}) must be below schedule.horizon_samples "
                       f"({self.horizon_samples})")
        if self.kind == "wsd" and self.horizon_samples > 0 and \
                self.warmup_samples > self.horizon_samples * (1 - self.cooldown_fraction):
            out.append(f"schedule.warmup_samples ({self.warmup_samples}) runs into the cooldown: it must end before "
                       f"{1 - self.cooldown_fraction:g} of schedule.horizon_samples ({self.horizon_samples})")
        if not 0.0 <= self.min_ratio <= 1.0:
            out.append(f"optimizer.min_lr: must lie between 0 and optimizer.lr (it is {self.min_ratio:g} x lr)")
        if self.kind in ("constant", "inverse_sqrt") and self.horizon_samples > 0:
            out.append(f"schedule.horizon_samples: a {self.kind} schedule has no horizon and would ignore "
                       f"{self.horizon_samples}; a run of known length takes kind = \"cosine\" or \"wsd\"")
        if self.kind == "inverse_sqrt" and 0 < self.timescale_samples < self.warmup_samples:
            out.append(f"schedule.timescale_samples ({self.timescale_samples}) must be at least "
                       f"schedule.warmup_samples ({self.warmup_samples}): below it the lr would drop at the warmup's "
                       f"end (0 takes the warmup's length)")
        return out


def lr_factor(schedule: Schedule, samples: float) -> float:
    """The factor (0..1] of the peak lr after ``samples`` samples of the whole swarm."""
    s = max(0.0, float(samples))
    lo = schedule.min_ratio
    if schedule.warmup_samples > 0 and s < schedule.warmup_samples:
        # from 1/100 of the peak, not 0: the first steps of a run must move the model
        return 0.01 + 0.99 * s / schedule.warmup_samples
    if schedule.kind == "cosine":
        span = schedule.horizon_samples - schedule.warmup_samples
        t = min(1.0, (s - schedule.warmup_samples) / span) if span > 0 else 1.0
        return lo + 0.5 * (1.0 - lo) * (1.0 + math.cos(math.pi * t))
    if schedule.kind == "wsd":
        length = schedule.cooldown_fraction * schedule.horizon_samples
        start = schedule.horizon_samples - length
        if s <= start:
            return 1.0
        t = min(1.0, (s - start) / length) if length > 0 else 1.0
        return 1.0 - (1.0 - lo) * t
    if schedule.kind == "inverse_sqrt":
        timescale = max(1, schedule.timescale_samples or schedule.warmup_samples)
        return max(lo, math.sqrt(timescale / max(s, timescale)))
    return 1.0


@dataclass(frozen=True)
class RoundClock:
    """Where a round's local steps stand on the schedule, from values every member of the round agrees on.

    ``base``: the swarm's samples when the round began (the shared state's count, which every member holds).
    ``last_round``: the samples the round before added to it, all its members' together (in the shared state too).
    A local step ``k`` of the round stands at ``base + k * last_round / inner_steps``: the swarm is taken to go on
    at the pace of the round before. Never the node's own running count: a node that takes more steps than its
    groupmates goes on along the same line, and every member's step ``k`` takes the same lr. A round with no round
    before it (a new run) moves by ``first_step`` samples a step (the run's batch: one node's pace)."""

    base: int = 0
    last_round: int = 0
    inner_steps: int = 1
    first_step: float = 0.0

    @property
    def per_step(self) -> float:
        if self.last_round > 0:
            return self.last_round / max(1, self.inner_steps)
        return self.first_step

    def samples_at(self, step: int) -> float:
        """The swarm's samples that local step ``step`` (0: the round's first) stands at."""
        return self.base + max(0, step) * self.per_step
