"""hivemind's matchmaking, for the rounds whose group does not form on the progress board (``group_formation`` =
"board" falls back to it; "matchmaking" uses only it): :func:`make_averager` builds the averager, and a round keys
its group by :func:`round_group_bits`."""

from __future__ import annotations

import multiprocessing as mp
import signal

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.dht import DHT

from cotrain.config import AveragingConfig

ROUND_KEY_BITS = 16  # the round number, modulo 2**16, is the hivemind group key


def round_group_bits(round_number: int) -> str:
    return format(round_number % (1 << ROUND_KEY_BITS), f"0{ROUND_KEY_BITS}b")


def make_averager(dht: DHT, prefix: str, cfg: AveragingConfig, client_mode: bool = False) -> DecentralizedAverager:
    """hivemind's averager, used for matchmaking only (its all-reduce averages one dummy number; the state is
    served by the :class:`Exchange`). Call on the main thread: hivemind requires it, and it sets SIGINT to ignored
    in this process, which is restored here."""
    if mp.get_start_method(allow_none=True) not in (None, "fork"):
        raise RuntimeError("cotrain needs the 'fork' multiprocessing start method for hivemind's averager")
    handler = signal.getsignal(signal.SIGINT)
    averager = DecentralizedAverager(
        [torch.zeros(1)], dht, prefix=prefix, start=True,
        target_group_size=cfg.target_group_size or None, min_group_size=2, initial_group_bits=round_group_bits(0),
        min_matchmaking_time=cfg.matchmaking_time, request_timeout=cfg.request_timeout,
        allreduce_timeout=cfg.allreduce_timeout, next_chunk_timeout=max(cfg.request_timeout, 5.0),
        client_mode=client_mode, allow_state_sharing=False, shutdown_timeout=5.0,
    )
    signal.signal(signal.SIGINT, handler)
    return averager
