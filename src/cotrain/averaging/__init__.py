"""The data plane: finding peers over hivemind's DHT, forming groups, and averaging with them."""

import functools
from typing import Optional

from cotrain.averaging.allreduce import AllReduceFailed, AllReduceResult, butterfly_allreduce, weighted_mean
from cotrain.averaging.dht import load_record_key, start_dht, visible_maddrs
from cotrain.averaging.diloco import DiLoCo
from cotrain.averaging.exchange import Exchange, UploadLimiter
from cotrain.averaging.progress import Action, Decision, PeerProgress, ProgressBoard, RoundRules, round_decision
from cotrain.averaging.admission import Admission, AdmissionError, Verdict
from cotrain.averaging.matchmaking import make_averager
from cotrain.averaging.round_stats import RoundStats
from cotrain.averaging.round_run import OnSent
from cotrain.averaging.rounds import RoundAverager
from cotrain.averaging.state import STATE_KEY, download_state, pick_donors
from cotrain.averaging.sync import SyncAveraging
from cotrain.optim.schedule import Schedule, lr_factor

__all__ = [
    "Admission", "AdmissionError", "Verdict",
    "Action", "AllReduceFailed", "AllReduceResult", "Decision", "DiLoCo", "Exchange", "PeerProgress", "ProgressBoard",
    "RoundAverager", "RoundRules", "RoundStats", "STATE_KEY", "SyncAveraging", "build_strategy", "download_state",
    "pick_donors", "UploadLimiter",
    "butterfly_allreduce", "load_record_key", "make_averager", "round_decision", "start_dht", "visible_maddrs", "weighted_mean",
]


def build_strategy(model, optimizer, dht, run_id: str, cfg, peer_id: str, admission: Admission,
                   client_mode: bool = False, upload_bps: float = 0.0, record_key=None,
                   attack: str = "", overclaim: float = 1.0, ports=None, evidence=None) -> RoundAverager:
    """The averaging strategy of a run config (:class:`cotrain.config.RunConfig`); ``upload_bps`` > 0 caps what
    this peer sends to others, in bits per second; ``record_key`` signs this peer's DHT records (see
    :func:`load_record_key`); ``admission`` checks the peers this one deals with and presents its credential
    (:class:`Admission`); ``attack`` makes this peer byzantine (:data:`cotrain.averaging.attacks.ATTACKS`), for
    benches and tests of robust aggregation only; ``overclaim`` > 1 makes it claim that many times the samples it
    trained on (benches of weights by work, :mod:`cotrain.averaging.work`); ``ports``: the board, exchange and
    matchmaker to use instead of the node's on ``dht`` (:mod:`cotrain.averaging.ports`; tests:
    :class:`cotrain.averaging.testing.MemorySwarm`); ``evidence``: keeps each round's evidence for a validator
    (:class:`cotrain.verification.evidence.EvidenceKeeper`; DiLoCo only, whose contribution is one round's work)."""
    cls = SyncAveraging if cfg.averaging.strategy == "sync" else DiLoCo
    strategy = cls(model, optimizer, cfg.averaging, cfg.optimizer.grad_clip)
    schedule = Schedule.from_config(cfg)
    outer_lr_at = functools.partial(lr_factor, schedule) if cfg.schedule.outer else None
    return RoundAverager(strategy, model, dht, run_id, cfg.averaging, cfg.compression, peer_id,
                         admission=admission, client_mode=client_mode, seed=cfg.run.seed, upload_bps=upload_bps,
                         record_key=record_key, attack=attack, step_samples=cfg.data.batch_size,
                         outer_lr_at=outer_lr_at, overclaim=overclaim, ports=ports,
                         on_sent=evidence_of(strategy, evidence))


def evidence_of(strategy, evidence) -> Optional[OnSent]:
    """What keeps each round's evidence (DiLoCo's round's global parameters and the contribution sent), or None."""
    if evidence is None or not isinstance(strategy, DiLoCo):
        return None
    return lambda round_number, state_hash, sent, seen: evidence.keep(round_number, state_hash,
                                                                      strategy.global_params, sent, seen)
