"""The loss score of one contribution: does applying it lower the loss on the contributor's own work unit, and by more
than on a random unit?

A validator holds the round's global parameters, a member's contribution (its pseudo-gradient: global minus local
parameters, decoded) and the outer step size, and evaluates the loss with and without the contribution applied
(``params - step * contribution``) on two units: the one the member was given ("own") and one drawn at random
("random"). An honest member trained on its own unit, so its update lowers that unit's loss, and lowers it more than
an unseen unit's. The checks, in order, each with the attack it answers:

- the contribution is malformed (count, shapes, non-finite values): garbage;
- it is all zeros: a free rider, claiming samples and contributing nothing;
- it does not lower the own unit's loss by ``min_own_gain``: noise of a plausible norm (to first order it changes
  nothing, to second order it raises the loss), an update scaled far past the minimum (x10), often a stale update;
- it raises the random unit's loss by more than ``max_random_harm``: an update that serves one unit at the model's
  expense (sabotage, a poisoned unit);
- it lowers the own unit's loss no more than the random unit's (``min_own_advantage``): training on other data than
  the unit it claims.

What the loss score cannot see: a small shift of an honest update in one direction ("a little is enough") still
lowers both losses; comparing with a replay (:mod:`cotrain.verification.replay`) catches it. The last check is weak
evidence on its own: with units drawn from one distribution and little memorization an honest update lowers both
units' losses alike, so a validator weighs this failure lightly (:attr:`Score.failed` says which check failed).

Gains are relative (``(before - after) / |before|``) so that one threshold serves every model and every stage of
training. The loss is injected: ``loss_on(params, which)`` with ``which`` in ``("own", "random")`` returns a float,
lower is better, deterministic for the same arguments (the same batches each call).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

#: the own unit's loss must fall by at least this fraction: an update trained for H steps on those very samples
#: lowers their loss by far more, even late in training, while a zero or noise update moves it by ~0 or raises it
MIN_OWN_GAIN = 1e-3
#: the random unit's loss may rise by at most this fraction: honest updates on non-iid units can raise another unit's
#: loss a little (the group's average, not every update, is what improves every unit), a tenth of the loss is damage
MAX_RANDOM_HARM = 0.10
#: the own unit's relative gain must exceed the random unit's by at least this much: an honest member has seen its
#: unit's samples, one that trained on other data has seen neither unit. 0: no margin, as with iid units the honest
#: advantage is small; raise it when bench/verify.py shows the honest advantage of a model and its units
MIN_OWN_ADVANTAGE = 0.0
#: losses are divided by at least this, so that a loss of 0 gives finite gains
LOSS_FLOOR = 1e-12

#: the names :attr:`Score.failed` takes
MALFORMED, ZERO, NO_GAIN, BLOWS_UP = "malformed", "zero", "no_gain", "blows_up"
HARM, NOT_OWN_DATA = "harm", "not_own_data"

LossOn = Callable[[list[torch.Tensor], str], float]


@dataclass(frozen=True)
class Score:
    """A contribution's loss score. Losses are nan where a check failed before they were computed."""
    verdict: str  # "pass" or "fail"
    reason: str
    failed: str = ""  # which check failed (one of the names above), "" when passed
    own_before: float = math.nan
    own_after: float = math.nan
    random_before: float = math.nan
    random_after: float = math.nan

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def own_gain(self) -> float:
        return relative_gain(self.own_before, self.own_after)

    @property
    def random_gain(self) -> float:
        return relative_gain(self.random_before, self.random_after)

    @property
    def advantage(self) -> float:
        return self.own_gain - self.random_gain


def relative_gain(before: float, after: float) -> float:
    """How much of the loss ``before`` is gone ``after`` (negative: it rose)."""
    return (before - after) / max(abs(before), LOSS_FLOOR)


def malformed(params: Sequence[torch.Tensor], contribution: Sequence[torch.Tensor]) -> str:
    """Why ``contribution`` cannot be applied to ``params`` ("" when it can)."""
    if len(contribution) != len(params):
        return f"contribution: {len(contribution)} tensors, the model has {len(params)}"
    for i, (p, c) in enumerate(zip(params, contribution)):
        if not isinstance(c, torch.Tensor):
            return f"contribution[{i}]: not a tensor"
        if c.shape != p.shape:
            return f"contribution[{i}]: shape {tuple(c.shape)}, the parameter's is {tuple(p.shape)}"
        if not c.is_floating_point():
            return f"contribution[{i}]: dtype {c.dtype}, not floating point"
        if not bool(torch.isfinite(c).all()):
            return f"contribution[{i}]: non-finite values"
    return ""


def applied(params: Sequence[torch.Tensor], contribution: Sequence[torch.Tensor], step: float) -> list[torch.Tensor]:
    """The parameters after an outer SGD step of ``step`` along ``contribution`` (new tensors; ``params`` stay)."""
    with torch.no_grad():
        return [p - step * c.to(p.dtype) for p, c in zip(params, contribution)]


def loss_score(loss_on: LossOn, params: Sequence[torch.Tensor], contribution: Sequence[torch.Tensor], step: float, *,
               min_own_gain: float = MIN_OWN_GAIN, max_random_harm: float = MAX_RANDOM_HARM,
               min_own_advantage: float = MIN_OWN_ADVANTAGE) -> Score:
    """Score ``contribution`` against the round's global ``params`` with outer step ``step``.

    A hostile contribution gives a failing Score, never an exception. ValueError: a bad ``step`` or threshold, or a
    non-finite loss of the global parameters (the validator's loss, not the contribution, is at fault).
    """
    if not (math.isfinite(step) and step > 0):
        raise ValueError(f"step: expected a finite positive number, got {step}")
    if not (math.isfinite(min_own_gain) and math.isfinite(max_random_harm) and math.isfinite(min_own_advantage)):
        raise ValueError("thresholds must be finite")
    why = malformed(params, contribution)
    if why:
        return Score("fail", why, MALFORMED)
    if all(not bool(c.any()) for c in contribution):
        return Score("fail", "all-zero update: claims work and contributes nothing", ZERO)
    own_before, random_before = float(loss_on(list(params), "own")), float(loss_on(list(params), "random"))
    if not (math.isfinite(own_before) and math.isfinite(random_before)):
        raise ValueError(f"loss_on: non-finite loss of the global parameters ({own_before}, {random_before})")
    after = applied(params, contribution, step)
    own_after = float(loss_on(after, "own"))
    figures = dict(own_before=own_before, own_after=own_after, random_before=random_before)
    if not math.isfinite(own_after):
        return Score("fail", f"the own unit's loss becomes {own_after}", BLOWS_UP, **figures)
    own_gain = relative_gain(own_before, own_after)
    if own_gain < min_own_gain:
        return Score("fail", f"lowers its own unit's loss by {own_gain:.2%} (at least {min_own_gain:.2%} expected): "
                     "no training on it shows", NO_GAIN, **figures)
    random_after = float(loss_on(after, "random"))
    figures["random_after"] = random_after
    if not math.isfinite(random_after):
        return Score("fail", f"a random unit's loss becomes {random_after}", BLOWS_UP, **figures)
    random_gain = relative_gain(random_before, random_after)
    if random_gain < -max_random_harm:
        return Score("fail", f"raises a random unit's loss by {-random_gain:.2%} (at most {max_random_harm:.2%})",
                     HARM, **figures)
    if own_gain - random_gain < min_own_advantage:
        return Score("fail", f"lowers its own unit's loss by {own_gain:.2%}, a random unit's by {random_gain:.2%}: "
                     "not trained on its own unit", NOT_OWN_DATA, **figures)
    return Score("pass", f"lowers its own unit's loss by {own_gain:.2%}, a random unit's by {random_gain:.2%}",
                 **figures)
