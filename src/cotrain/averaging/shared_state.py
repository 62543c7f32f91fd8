"""The state every member of a group holds identically (:class:`SharedState`): the strategy's shared tensors and
PowerSGD's, read and written under one lock (the exchange's thread serves them to joiners while the main thread
applies rounds), their hash (computed in the background after each change), and the checkpoint a joiner downloads.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import torch

from cotrain.averaging.reduction import Reduction
from cotrain.averaging.state import StateHash
from cotrain.averaging.strategy import Strategy
from cotrain.checkpoint import encode_checkpoint, named_state


class SharedState:
    def __init__(self, strategy: Strategy, reduction: Reduction, param_names: Sequence[str], run_id: str):
        self.strategy, self.reduction, self.param_names, self.run_id = strategy, reduction, list(param_names), run_id
        #: held while the tensors are read or written as a whole
        self.lock = threading.Lock()
        self._hash = StateHash(strategy.shared_tensors())

    def tensors(self) -> list[torch.Tensor]:
        """The shared tensors themselves (the strategy's, then PowerSGD's); take :attr:`lock` to read them whole."""
        powersgd = self.reduction.powersgd
        return self.strategy.shared_tensors() + (powersgd.state_tensors() if powersgd else [])

    def copy(self) -> list[torch.Tensor]:
        with self.lock:
            return [t.detach().cpu().clone() for t in self.tensors()]

    def snapshot(self, metadata: Callable[[], dict]) -> tuple[dict, list[torch.Tensor]]:
        """(metadata, a copy of the tensors), taken together: ``metadata()`` is called under the lock."""
        with self.lock:
            said = dict(run_id=self.run_id, strategy=self.strategy.name, **metadata(),
                        **self.strategy.shared_metadata())
            return said, [t.detach().cpu().clone() for t in self.tensors()]

    def encoded(self, metadata: Callable[[], dict]) -> bytes:
        """The state as a peer downloads it (checkpoint format)."""
        said, tensors = self.snapshot(metadata)
        return encode_checkpoint(named_state(self.param_names, tensors), said)

    def check(self, metadata: dict, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether a downloaded state can be taken (raises ValueError naming what does not fit); -> True when it holds
        only the model's parameters (a checkpoint a coordinator made): the strategy's own state then starts afresh."""
        targets = self.tensors()
        if metadata.get("run_id") != self.run_id:
            raise ValueError(f"the state belongs to run {metadata.get('run_id')!r}, not {self.run_id!r}")
        params_only = len(tensors) == len(self.param_names)
        if not params_only and metadata.get("strategy") != self.strategy.name:
            raise ValueError(f"the state is of strategy {metadata.get('strategy')!r}, not {self.strategy.name!r}")
        if not params_only and len(tensors) != len(targets):
            raise ValueError(f"downloaded {len(tensors)} tensors, expected {len(targets)}")
        for dst, src in zip(targets, tensors):
            if dst.shape != src.shape:
                raise ValueError(f"downloaded tensor of shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
        return params_only

    def write(self, tensors: Sequence[torch.Tensor], params_only: bool) -> None:
        """Copy a checked state in (the caller holds :attr:`lock`, under no_grad, and settled the hash first)."""
        for dst, src in zip(self.tensors(), tensors):
            dst.copy_(src.to(dst.device, dst.dtype))
        if params_only:
            for extra in self.strategy.shared_tensors()[len(self.param_names):]:
                extra.zero_()
            if self.reduction.powersgd is not None:
                self.reduction.powersgd.reset()

    def hash(self) -> str:
        """The hash of the tensors as they are now (waits for its computation when a change just started it)."""
        return self._hash.value()

    def settle(self) -> None:
        """Wait until no hash runs: the tensors may change."""
        self._hash.settle()

    def changed(self) -> None:
        """The tensors changed: hash them anew, in the background."""
        self._hash.update(self.strategy.shared_tensors())

    def shutdown(self) -> None:
        self._hash.shutdown()
