"""The experts' last checkpoints at the coordinator (issue 56): a host sends each expert it holds every so often, and
a host given an expert later (the same host after a restart, or another machine) takes it back from here, so that
a moved expert goes on from its last state. One file an expert, written atomically; an upload is checked against
the run's own expert before it replaces the last one (:func:`cotrain.moe.expert_state.restore_expert`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Optional, Sequence

from torch import nn

from cotrain.checkpoint import atomic_write_bytes
from cotrain.moe.expert_state import max_expert_bytes, restore_expert


class ExpertCheckpoints:
    """Under ``folder``, the checkpoints of the experts ``uids``; ``make()`` builds a fresh expert of the run's shape
    (what an upload is checked against)."""

    def __init__(self, folder: Path, uids: Sequence[str], make: Callable[[], nn.Module]):
        self.folder, self.uids, self.make = Path(folder), frozenset(uids), make
        self.max_bytes = max_expert_bytes(make())
        self._lock = threading.Lock()  # two uploads of one expert: the later write wins whole

    def _path(self, uid: str) -> Path:
        if uid not in self.uids:  # a uid is a file name: only the run's own
            raise KeyError(uid)
        return self.folder / f"{uid}.safetensors"

    def save(self, uid: str, data: bytes) -> int:
        """Keep ``data`` as ``uid``'s checkpoint once it checks out (ExpertStateError naming the field when not).
        -> the updates it holds."""
        restored = restore_expert(data, uid, self.make())
        with self._lock:
            atomic_write_bytes(self._path(uid), data)
        return restored.updates

    def load(self, uid: str) -> Optional[bytes]:
        """``uid``'s last checkpoint, or None when none was saved."""
        try:
            return self._path(uid).read_bytes()
        except FileNotFoundError:
            return None
