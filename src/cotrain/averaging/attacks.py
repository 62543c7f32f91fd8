"""Byzantine contributions, for benches and tests of robust aggregation (:mod:`cotrain.averaging.robust`).

A node started with ``--attack NAME`` replaces what it contributes to every round by one of these; everything
else it does is honest (it applies the group's result, so its shared state stays consistent and it keeps being
matched). The attacks of the robust-aggregation literature (e.g. Karimireddy, He and Jaggi, ICML 2021; Gorbunov
et al., "Secure Distributed Training at Scale", 2022), each with strength ``ATTACK_STRENGTH``:

- ``scale``: the honest contribution times ``ATTACK_STRENGTH``;
- ``sign_flip``: the honest contribution times ``-ATTACK_STRENGTH``;
- ``random``: Gaussian noise whose norm is ``ATTACK_STRENGTH`` times the honest contribution's.

A byzantine *reducer* (corrupting the averages it sends back in the butterfly all-reduce) is not among them:
defending against it needs BTARD's verification, which cotrain does not do.
"""

from __future__ import annotations

from typing import Callable

import torch

from cotrain.config import ATTACKS

ATTACK_STRENGTH = 10.0

Attack = Callable[[torch.Tensor], torch.Tensor]


def make_attack(name: str, seed: int = 0, strength: float = ATTACK_STRENGTH) -> Attack:
    if name == "scale":
        return lambda v: v * strength
    if name == "sign_flip":
        return lambda v: v * -strength
    if name == "random":
        generator = torch.Generator().manual_seed(seed + 7919)

        def noise(v: torch.Tensor) -> torch.Tensor:
            z = torch.randn(v.shape, generator=generator, dtype=torch.float32).to(v.dtype)
            return z * (strength * v.norm() / z.norm().clamp_min(1e-12))

        return noise
    raise ValueError(f"attack: expected one of {', '.join(ATTACKS)}, got {name!r}")
