"""What a peer's rounds reach the swarm through: the ports of :class:`~cotrain.averaging.rounds.RoundAverager`.

- ``board``: the progress board (:class:`~cotrain.averaging.progress.ProgressBoard` on hivemind's DHT): publish this
  peer's record, read its shard's or every shard's;
- ``exchange``: the transport of meetings, all-reduces and state downloads (:class:`~cotrain.averaging.exchange.
  Exchange` over the DHT's libp2p daemon; :class:`~cotrain.averaging.meeting.Transport` is what a meeting needs of
  it);
- ``matchmaker``: hivemind's averager, for groups that do not form on the board (None with ``group_formation =
  "board_only"``);
- ``clock``: the swarm's time (:mod:`cotrain.averaging.clock`): a record's time and age, a round's start.

:meth:`Ports.over_dht` builds a node's; :mod:`cotrain.averaging.testing` has a swarm of them in one process's
memory, where the real strategies run rounds in seconds and without a daemon.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from cotrain.averaging.admission import Admission
from cotrain.averaging.clock import Clock, DhtClock
from cotrain.averaging.exchange import Exchange, UploadLimiter
from cotrain.averaging.matchmaking import make_averager
from cotrain.averaging.progress import ProgressBoard
from cotrain.config import AveragingConfig


@dataclass
class Ports:
    board: Any
    exchange: Any
    matchmaker: Optional[Any] = None
    clock: Clock = field(default_factory=DhtClock)

    @classmethod
    def over_dht(cls, dht, run_id: str, cfg: AveragingConfig, admission: Admission, *, ttl: float,
                 record_key=None, client_mode: bool = False, upload_bps: float = 0.0) -> "Ports":
        """A node's ports on its DHT (hivemind's averager is made here: call on the main thread)."""
        board = ProgressBoard(dht, run_id, ttl=ttl, admission=admission, private_key=record_key,
                              shards=cfg.board_shards, shard_rounds=cfg.group_rounds)
        # hivemind's averager, for matchmaking; "board_only" has none (a process, and ~100 MB of PSS after a few
        # minutes, less per node: forked from the node, its pages turn private as it runs; bench/scale.py)
        matchmaker = (make_averager(dht, f"{run_id}_avg", cfg, client_mode=client_mode)
                      if cfg.group_formation != "board_only" else None)
        # a round publishes under up to four tags (its meeting, PowerSGD's two phases, the states): two rounds' worth
        exchange = Exchange(dht, f"{run_id}_exchange", admission, keep_tags=8,
                            limiter=UploadLimiter(upload_bps) if upload_bps else None)
        return cls(board, exchange, matchmaker)

    def shutdown(self) -> None:
        """Stop the exchange, then hivemind's averager (the board has nothing of its own to stop)."""
        self.exchange.shutdown()
        if self.matchmaker is not None and self.matchmaker.is_alive():
            self.matchmaker.shutdown()
