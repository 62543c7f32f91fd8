"""The run config's ``[moe]`` section (:class:`cotrain.config.RunConfig`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from cotrain.config_file import Section


class MoEConfig(Section):
    """``model.kind = "moe_lstm"``: the mixture-of-experts layers after the LSTM (cotrain.moe). Each layer's experts
    lie on a grid (``grid = [4, 4]``: 16 experts, each named by one index a dimension, the gate scoring each
    dimension apart); every chunk of ``chunk`` time steps of a row goes to the ``k`` best experts that are up, and
    a training step needs ``k_min`` of them to answer for every chunk."""

    grid: list[int] = Field([4, 4], min_length=1, max_length=4)
    #: each expert is a position-wise MLP, model.hidden_size -> expert_hidden -> model.hidden_size
    expert_hidden: int = Field(512, ge=1, le=65536)
    k: int = Field(4, ge=1, le=64)
    k_min: int = Field(1, ge=1, le=64)
    #: time steps routed together: one call to an expert carries a chunk of each row sent to it
    chunk: int = Field(32, ge=1, le=4096)
    layers: int = Field(1, ge=1, le=8)
    #: "hosted": the experts live on expert hosts (``cotrain expert serve``), assigned by the coordinator, and a
    #: trainer calls them over the data plane; its shared state is everything else. "local": every trainer holds
    #: every expert and averages them with the rest (the reference a decentralized mixture is measured against)
    experts: Literal["hosted", "local"] = "hosted"
    #: seconds a trainer waits for an expert's answer before leaving it out of the step (and not asking it again
    #: for ``down_s``): a call carries a chunk of a batch's rows, a few ms on a LAN, a few hundred over a WAN
    timeout_s: float = Field(5.0, gt=0, le=300)
    #: a host that just took an expert refuses its calls for the moment it takes to load its checkpoint, and a host
    #: that is gone leaves the coordinator's directory within about 20 s: 10 s costs a dead host's experts a few
    #: timed-out calls, and a moving expert few skipped steps
    down_s: float = Field(10.0, ge=0, le=3600)

    @model_validator(mode="after")
    def _sizes(self) -> "MoEConfig":
        if any(g < 1 or g > 4096 for g in self.grid):
            raise ValueError(f"grid: every dimension between 1 and 4096, got {self.grid}")
        experts = 1
        for g in self.grid:
            experts *= g
        if self.k > experts:
            raise ValueError(f"k: {self.k} is more than the grid's {experts} experts")
        if self.k_min > self.k:
            raise ValueError(f"k_min: {self.k_min} is more than k ({self.k})")
        return self
