"""Serving the newest intact checkpoint to a node (``GetCheckpoint``) in chunks of at most ``CHECKPOINT_CHUNK`` bytes.

A checkpoint whose file cannot be read or does not match its recorded sha256 is skipped with a warning and the
previous one is offered: a node that warm-starts gets a checkpoint that is whole or none. The first chunk carries
the total size, the round and the sha256, so that the node can check what it assembled.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Iterable, Iterator, Optional

from cotrain.v1 import coordinator_pb2 as pb

from cotrain.coordinator.store import CheckpointRow

logger = logging.getLogger(__name__)

CHECKPOINT_CHUNK = 1 << 20


def newest_intact(checkpoints: Iterable[CheckpointRow]) -> Optional[tuple[CheckpointRow, bytes]]:
    """The first of ``checkpoints`` (newest first, as the store lists them) that reads back whole, with its bytes;
    None when none does."""
    for checkpoint in checkpoints:
        try:
            data = Path(checkpoint.path).read_bytes()
        except OSError as e:
            logger.warning("checkpoint %s cannot be read (%s); offering the previous one", checkpoint.path, e)
            continue
        if hashlib.sha256(data).hexdigest() != checkpoint.sha256:
            logger.warning("checkpoint %s is corrupt; offering the previous one", checkpoint.path)
            continue
        return checkpoint, data
    return None


def checkpoint_chunks(checkpoint: CheckpointRow, data: bytes) -> Iterator[pb.CheckpointChunk]:
    """``data`` in chunks; only the first names the total, the round and the sha256."""
    for start in range(0, len(data), CHECKPOINT_CHUNK):
        first = start == 0
        yield pb.CheckpointChunk(data=data[start: start + CHECKPOINT_CHUNK], total=len(data) if first else 0,
                                 round=checkpoint.round if first else 0, sha256=checkpoint.sha256 if first else "")
