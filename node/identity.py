"""What a node keeps in its state dir across runs, per coordinator address: the node id the coordinator gave it (so
a restarted node rejoins as itself, with its work units) and the coordinator's public key (a changed key means the
coordinator lost its state dir, or is another one). Both files are written atomically."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

from cotrain.checkpoint import atomic_write_bytes

logger = logging.getLogger(__name__)


class NodeIdentity:
    """``state_dir`` None: nothing is kept (a node without a state dir joins anew every time)."""

    def __init__(self, state_dir: Optional[Path], coordinator: str):
        self.state_dir, self.coordinator = state_dir, coordinator

    def _read(self, name: str) -> dict:
        path = self.state_dir / name
        try:
            saved = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            return {}
        return saved if isinstance(saved, dict) else {}

    def _write(self, name: str, value: str) -> None:
        saved = self._read(name)
        saved[self.coordinator] = value
        atomic_write_bytes(self.state_dir / name, json.dumps(saved).encode())

    def saved_node_id(self) -> str:
        """The node id this coordinator gave the node last time, or "" (a first join, or an unreadable file)."""
        if not self.state_dir:
            return ""
        node_id = self._read("node.json").get(self.coordinator, "")
        return node_id if isinstance(node_id, str) else ""

    def save_node_id(self, node_id: str) -> None:
        if self.state_dir:
            self._write("node.json", node_id)

    def keep_coordinator_key(self, public_key: bytes) -> None:
        """Keep the coordinator's public key; a changed key is logged, since it means the coordinator lost its state
        dir or is another one."""
        if not self.state_dir:
            return
        previous = self._read("coordinator-keys.json").get(self.coordinator)
        if previous == public_key.hex():
            return
        if previous is not None:
            logger.warning("the coordinator at %s signs with another key than last time: it lost its state dir or is "
                           "another coordinator", self.coordinator)
        self._write("coordinator-keys.json", public_key.hex())
