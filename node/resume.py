"""Where a node's weights come from when it starts, and what it keeps for its next start.

:func:`warm_start`: never random weights in a run that has progress: the state of the peer with the most progress,
else the newer of the coordinator's latest checkpoint and this node's own last state (of the same run), else the
run's initial weights (a new run). :func:`save_last`: the node's copy of the shared model and its averaging figures,
``STATE_DIR/last.safetensors``, which a later warm start of this node may resume from.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

from cotrain.averaging import RoundAverager
from cotrain.checkpoint import CheckpointError, decode_checkpoint, load_checkpoint, named_state, save_checkpoint
from cotrain.client import CoordinatorClient
from cotrain.config import RunConfig

from cotrain.node.terminal import download_progress

# the node's log lines, under the one name its volunteer knows (as the heartbeat's)
logger = logging.getLogger("cotrain.node.runner")

#: the node's own last state, in its state folder
LAST_STATE = "last.safetensors"


def warm_start(averaging: RoundAverager, client: CoordinatorClient, run_id: str, state_dir: Optional[Path],
               download_timeout: float) -> None:
    """Load the state ``averaging`` starts from: a peer's (waiting up to ``download_timeout`` seconds for one), else
    the newer of the coordinator's checkpoint and ``state_dir``'s last state among those of run ``run_id``; neither:
    the run's initial weights stay. A checkpoint that cannot be read is logged and passed over."""
    with download_progress("state from peers") as progress:
        if averaging.state.download(timeout=download_timeout, on_progress=progress):
            logger.info("warm start: downloaded the swarm's state at round %d from a peer", averaging.round)
            return
    candidates = []
    with download_progress("checkpoint from the coordinator") as progress:
        data = client.get_checkpoint(on_progress=progress)
    if data is not None:
        try:
            candidates.append(("the coordinator's checkpoint", decode_checkpoint(data, "the coordinator's checkpoint")))
        except CheckpointError as e:
            logger.warning("%s", e)
    own = state_dir / LAST_STATE if state_dir else None
    if own is not None and own.exists():
        try:
            candidates.append(("this node's last state", load_checkpoint(own)))
        except CheckpointError as e:
            logger.warning("%s", e)
    candidates = [(name, c) for name, c in candidates if c.metadata.get("run_id") == run_id]
    if candidates:
        name, best = max(candidates, key=lambda item: item[1].round)
        averaging.state.take_checkpoint(best)
        logger.info("warm start: no peer answered; resumed from %s at round %d", name, averaging.round)
    else:
        logger.info("no peer and no checkpoint has state yet: starting from the run's initial weights")


def save_last(averaging: RoundAverager, state_dir: Optional[Path], cfg: RunConfig) -> None:
    """Write ``averaging``'s shared state, the run's config and its averaging figures to ``state_dir``'s last state
    (no ``state_dir``: nothing)."""
    if not state_dir:
        return
    metadata, tensors = averaging.state.snapshot()
    names = averaging.param_names
    s = averaging.stats.snapshot()
    save_checkpoint(state_dir / LAST_STATE, named_state(names, tensors),
                    dict(metadata, config_toml=cfg.to_toml(), rounds=list(s.history), time=time.time(),
                         states_averaged=s.states_averaged, resyncs=s.resyncs, groups_kept=s.groups_kept,
                         board_reads=s.board_reads, board_reads_skipped=s.board_reads_skipped,
                         rounds_hosted=s.rounds_hosted))
