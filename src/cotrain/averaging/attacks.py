"""Byzantine contributions, for benches and tests of robust aggregation (:mod:`cotrain.averaging.robust`).

A node started with ``--attack NAME`` replaces what it contributes to every round by one of these; everything
else it does is honest (it applies the group's result, so its shared state stays consistent and it keeps being
matched). The attacks of the robust-aggregation literature (e.g. Karimireddy, He and Jaggi, ICML 2021; Gorbunov
et al., "Secure Distributed Training at Scale", 2022), each with strength ``ATTACK_STRENGTH``:

- ``scale``: the honest contribution times ``ATTACK_STRENGTH``;
- ``sign_flip``: the honest contribution times ``-ATTACK_STRENGTH``;
- ``random``: Gaussian noise whose norm is ``ATTACK_STRENGTH`` times the honest contribution's;

and those a verifier of contributions must catch (docs/design/verification.md, bench/verify.py):

- ``zero``: nothing at all (a free rider: it claims its samples and sends zeros);
- ``stale``: the contribution of its previous round (a stale update; its first round's is honest);
- ``alie``: "a little is enough" (Baruch et al., NeurIPS 2019), as one attacker can do it alone: every value
  shifted by ``ALIE_Z`` times its own magnitude, in one direction of signs fixed for the run, so that the update's
  norm grows by about 12% only and it stays inside any clipping radius;
- ``equivocate``: the group gets ``sign_flip``'s contribution while the node's evidence for a validator shows its
  honest one (:meth:`cotrain.averaging.reduction.Reduction.shown`): what binding the evidence to what the reducers
  took in catches (:mod:`cotrain.verification.witness`);
- ``other_data``: its contribution is honest training, on other data than its work units (:func:`other_data`: its
  batches' bytes through a fixed permutation, a text of the same statistics in another alphabet, as content one
  would inject), while its evidence names its units' rows.

A byzantine *reducer* (corrupting the averages it sends back in the butterfly all-reduce) is not among them:
defending against it needs BTARD's verification, which cotrain does not do.
"""

from __future__ import annotations

from typing import Callable

import torch

from cotrain.config import ATTACKS

ATTACK_STRENGTH = 10.0
#: the ALIE shift, in units of each value's magnitude (its stand-in for the honest updates' spread)
ALIE_Z = 0.5

Attack = Callable[[torch.Tensor], torch.Tensor]
EQUIVOCATE = "equivocate"
OTHER_DATA = "other_data"


def other_data(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A byte-level batch in another alphabet: every byte through one permutation of the 256, fixed for all runs."""
    permutation = torch.randperm(256, generator=torch.Generator().manual_seed(256))
    return tuple(permutation[t] for t in batch)


def make_attack(name: str, seed: int = 0, strength: float = ATTACK_STRENGTH) -> Attack:
    if name == OTHER_DATA:  # an honest contribution of dishonest training (the node's loop reads other data)
        return lambda v: v
    if name == "scale":
        return lambda v: v * strength
    if name in ("sign_flip", EQUIVOCATE):
        return lambda v: v * -strength
    if name == "random":
        generator = torch.Generator().manual_seed(seed + 7919)

        def noise(v: torch.Tensor) -> torch.Tensor:
            z = torch.randn(v.shape, generator=generator, dtype=torch.float32).to(v.dtype)
            return z * (strength * v.norm() / z.norm().clamp_min(1e-12))

        return noise
    if name == "zero":
        return torch.zeros_like
    if name == "stale":
        previous: list[torch.Tensor] = []

        def stale(v: torch.Tensor) -> torch.Tensor:
            out = previous[0] if previous and previous[0].shape == v.shape else v
            previous[:] = [v.clone()]
            return out

        return stale
    if name == "alie":
        generator = torch.Generator().manual_seed(seed + 104729)
        signs: list[torch.Tensor] = []

        def shift(v: torch.Tensor) -> torch.Tensor:
            if not signs or signs[0].shape != v.shape:
                signs[:] = [torch.randint(0, 2, v.shape, generator=generator).to(v.dtype) * 2 - 1]
            return v + ALIE_Z * signs[0] * v.abs()

        return shift
    raise ValueError(f"attack: expected one of {', '.join(ATTACKS)}, got {name!r}")
