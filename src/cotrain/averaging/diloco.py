"""DiLoCo rounds over hivemind (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
Models", 2023).

Every node keeps the round's *global* parameters (the same on every node) next to its local model. It takes local
inner steps; when the round ends it averages the pseudo-gradient ``global - local`` with the peers at the same
round (all-reduce through hivemind, weighted by the samples each node trained on), and every node applies the same
outer Nesterov step to the global parameters, then restarts its local model from them.

Rounds are kept consistent by construction:

- peers only match peers at the same round (the round number is the hivemind group key);
- a node that sees a peer ahead of it downloads the global state (parameters, outer momentum, round) from the peer
  with the most progress, instead of averaging a stale pseudo-gradient;
- a round never waits forever: matchmaking and all-reduce both have time limits, and after a failed round the
  node keeps training and tries again;
- a node alone in the swarm takes the outer step with its own pseudo-gradient.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.compression import CompressionBase, Float16Compression, NoCompression
from hivemind.dht import DHT

from cotrain.averaging.progress import (Action, Decision, PeerProgress, ProgressBoard, RoundRules, live_peers,
                                       round_decision)
from cotrain.config import AveragingConfig, CompressionConfig

logger = logging.getLogger(__name__)

ROUND_KEY_BITS = 16  # the round number, modulo 2**16, is the hivemind group key


def hivemind_compression(cfg: CompressionConfig) -> CompressionBase:
    return {"none": NoCompression(), "fp16": Float16Compression()}[cfg.kind]


def round_group_bits(round_number: int) -> str:
    return format(round_number % (1 << ROUND_KEY_BITS), f"0{ROUND_KEY_BITS}b")


class SwarmAverager(DecentralizedAverager):
    """A hivemind averager whose downloadable state is supplied by a callback (the node's global state)."""

    def __init__(self, averaged_tensors: Sequence[torch.Tensor], dht: DHT, *,
                 get_state: Callable[[], tuple[dict, list[torch.Tensor]]], **kwargs):
        self._get_state = get_state
        super().__init__(averaged_tensors, dht, **kwargs)

    def get_current_state(self):
        metadata, tensors = self._get_state()
        return metadata, tensors, None


def make_averager(tensors: Sequence[torch.Tensor], dht: DHT, prefix: str, cfg: AveragingConfig,
                  compression: CompressionBase, get_state, client_mode: bool = False) -> SwarmAverager:
    """Create and start the averager. Call on the main thread: hivemind requires it, and it sets SIGINT to ignored
    in this process, which is restored here."""
    handler = signal.getsignal(signal.SIGINT)
    averager = SwarmAverager(
        tensors, dht, get_state=get_state, prefix=prefix, start=True,
        target_group_size=None, min_group_size=2, initial_group_bits=round_group_bits(0),
        min_matchmaking_time=cfg.matchmaking_time, request_timeout=cfg.request_timeout,
        allreduce_timeout=cfg.allreduce_timeout, next_chunk_timeout=max(cfg.request_timeout, 5.0),
        compression=compression, client_mode=client_mode,
        allow_state_sharing=not client_mode, declare_state_period=10.0, shutdown_timeout=5.0,
    )
    signal.signal(signal.SIGINT, handler)
    return averager


@dataclass
class RoundStats:
    rounds_completed: int = 0  # averaged with at least one peer
    solo_rounds: int = 0  # outer step taken alone: nobody else was at this round
    failed_rounds: int = 0  # tried to average, no group formed or all-reduce failed
    partial_rounds: int = 0  # averaged with fewer peers than were seen at this round
    resyncs: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    last_group_size: int = 0
    last_reason: str = ""
    history: list = field(default_factory=list)


class DiLoCo:
    """Wraps a model trained by a local (inner) optimizer; call :meth:`after_inner_step` after every local step."""

    def __init__(self, model: torch.nn.Module, dht: DHT, run_id: str, cfg: AveragingConfig,
                 compression: CompressionConfig, peer_id: str, client_mode: bool = False):
        _ensure_fork()
        self.model, self.dht, self.cfg, self.run_id = model, dht, cfg, run_id
        self._lock = threading.Lock()  # the global state is read by hivemind's thread when a peer downloads it
        self.peer_id = peer_id
        self.params = [p for p in model.parameters()]
        self.global_params = [p.detach().clone() for p in self.params]
        self.outer = torch.optim.SGD(self.global_params, lr=cfg.outer_lr, momentum=cfg.outer_momentum,
                                     nesterov=cfg.outer_momentum > 0)
        self.momentum = [torch.zeros_like(p) for p in self.global_params]
        if cfg.outer_momentum > 0:
            for p, buf in zip(self.global_params, self.momentum):
                self.outer.state[p]["momentum_buffer"] = buf
        self.payload_bytes_per_value = 2 if compression.kind == "fp16" else 4
        self.delta = [torch.zeros_like(p, device="cpu") for p in self.params]
        self.round = 0
        self.samples_total = 0
        self.steps_in_round = 0
        self.samples_in_round = 0
        self.mid_round = False
        self.reached_h_at: Optional[float] = None
        self.retry_at = 0.0
        self.stats = RoundStats()
        self.rules = RoundRules(cfg.inner_steps, cfg.round_wait, stale_after=3 * cfg.progress_interval + 1.0)
        self.board = ProgressBoard(dht, f"{run_id}_progress", ttl=self.rules.stale_after)
        self.phase = "train"
        self._peers: list[PeerProgress] = []
        self._stop_publishing = threading.Event()
        self._publisher = threading.Thread(target=self._publish_loop, name="progress", daemon=True)
        self.averager = make_averager(self.delta, dht, f"{run_id}_diloco", cfg, hivemind_compression(compression),
                                      self.get_state, client_mode=client_mode)
        self.averager.state_sharing_priority = 0.0
        self._publisher.start()

    def _publish_loop(self) -> None:
        """Publish our progress and read the peers' every progress_interval, also while we average or download."""
        while not self._stop_publishing.is_set():
            try:
                self.board.publish(self.progress(self.phase))
                self._peers = self.board.read()
            except Exception as e:  # the DHT is shutting down or briefly unreachable
                logger.debug("progress publication failed: %r", e)
            self._stop_publishing.wait(self.cfg.progress_interval)

    # ---- shared state --------------------------------------------------------------------------------------------
    def get_state(self) -> tuple[dict, list[torch.Tensor]]:
        with self._lock:
            metadata = dict(run_id=self.run_id, round=self.round, samples_total=self.samples_total)
            return metadata, [p.detach().cpu().clone() for p in self.global_params + self.momentum]

    def set_state(self, metadata: dict, tensors: Sequence[torch.Tensor]) -> None:
        n = len(self.global_params)
        if len(tensors) != 2 * n or metadata.get("run_id") != self.run_id:
            raise ValueError(f"downloaded state does not fit this run (tensors: {len(tensors)}, expected {2 * n})")
        for dst, src in zip(self.global_params + self.momentum, tensors):
            if dst.shape != src.shape:
                raise ValueError(f"downloaded tensor of shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
        with torch.no_grad(), self._lock:
            for dst, src in zip(self.global_params + self.momentum, tensors):
                dst.copy_(src)
            for p, g in zip(self.params, self.global_params):
                p.copy_(g)
            self.round = int(metadata["round"])
            self.samples_total = int(metadata.get("samples_total", 0))
        self._start_round(mid_round=True)
        self.averager.state_sharing_priority = float(self.round)

    def load_state_from_peers(self, timeout: float = 30.0) -> bool:
        """Download the global state from the peer with the most progress; False when no peer has any."""
        try:
            result = self.averager.load_state_from_peers(timeout=timeout)
        except Exception as e:  # a timeout or a peer that vanished mid-download
            logger.warning("state download failed: %r", e)
            return False
        if result is None:
            return False
        metadata, tensors = result
        try:
            self.set_state(metadata, tensors)
        except (ValueError, KeyError, TypeError) as e:
            logger.warning("ignoring downloaded state: %s", e)
            return False
        return True

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The global parameters (named like the model's) and outer momentum, for a checkpoint."""
        names = [name for name, _ in self.model.named_parameters()]
        out = {f"model.{n}": p for n, p in zip(names, self.global_params)}
        out.update({f"outer_momentum.{n}": m for n, m in zip(names, self.momentum)})
        return out

    # ---- rounds --------------------------------------------------------------------------------------------------
    def _start_round(self, mid_round: bool) -> None:
        self.steps_in_round = 0
        self.samples_in_round = 0
        self.mid_round = mid_round
        self.reached_h_at = None
        self.averager.set_group_bits(round_group_bits(self.round), wait=False)

    def progress(self, phase: str = "train") -> PeerProgress:
        return PeerProgress(self.peer_id, self.round, self.steps_in_round, self.samples_in_round, phase,
                            self.mid_round, time.time())

    def after_inner_step(self, samples: int) -> Optional[Decision]:
        """Account one local step; end the round when the swarm is ready. Returns the decision when not TRAIN."""
        self.steps_in_round += 1
        self.samples_in_round += samples
        self.samples_total += samples
        now = time.time()
        if self.steps_in_round >= self.cfg.inner_steps and self.reached_h_at is None:
            self.reached_h_at = now
        if now < self.retry_at:
            return None
        decision = round_decision(now, self.progress(), self._peers, self.rules, self.reached_h_at)
        if decision.action is Action.TRAIN:
            return None
        self.stats.last_reason = decision.reason
        logger.info("round %d: %s", self.round, decision.reason)
        if decision.action is Action.RESYNC:
            self._resync()
        else:
            self._average()
        return decision

    def wait_for_peers(self, count: int, timeout: float, stop: Optional[threading.Event] = None) -> int:
        """Publish our progress and wait until ``count`` peers (ourselves included) are on the board."""
        deadline = time.time() + timeout
        while True:
            live = {p.peer_id for p in self._peers if time.time() - p.time <= self.rules.stale_after
                    and p.phase != "left"}
            live.add(self.peer_id)
            if len(live) >= count or time.time() >= deadline or (stop is not None and stop.is_set()):
                return len(live)
            time.sleep(self.cfg.progress_interval / 2)

    def _resync(self) -> None:
        self.stats.resyncs += 1
        if not self.load_state_from_peers():
            self.retry_at = time.time() + self.cfg.matchmaking_time

    def _average(self) -> None:
        with torch.no_grad(), self.averager.get_tensors() as delta:
            for d, g, p in zip(delta, self.global_params, self.params):
                d.copy_(g.cpu() - p.detach().cpu())
        peers_here = [p for p in live_peers(time.time(), self.progress(), self._peers, self.rules)
                      if p.round == self.round]
        if not peers_here:
            self._outer_step(group_size=1)
            self.stats.solo_rounds += 1
            return
        self.phase = "average"
        self.board.publish(self.progress(self.phase))
        timeout = self.cfg.matchmaking_time * 2 + self.cfg.request_timeout
        try:
            gathered = self.averager.step(weight=float(max(1, self.samples_in_round)),
                                          gather=dict(round=self.round, samples=self.samples_in_round),
                                          timeout=timeout, allow_retries=False)
        except Exception as e:
            logger.warning("round %d: averaging failed: %r", self.round, e)
            gathered = None
        finally:
            self.phase = "train"
        if not gathered:
            self.stats.failed_rounds += 1
            self.stats.last_reason = f"round {self.round}: no group formed; training on and retrying"
            self.retry_at = time.time() + self.cfg.matchmaking_time
            return
        group_size = len(gathered)
        others = [v for k, v in gathered.items() if str(k) != self.peer_id]
        self.samples_total += sum(int(v.get("samples", 0)) for v in others if isinstance(v, dict))
        if group_size < len(peers_here) + 1:
            self.stats.partial_rounds += 1
            logger.warning("round %d averaged %d of the %d peers seen at this round",
                           self.round, group_size, len(peers_here) + 1)
        self._outer_step(group_size)
        self.stats.rounds_completed += 1

    def _outer_step(self, group_size: int) -> None:
        with torch.no_grad(), self.averager.get_tensors() as delta:
            for g, d in zip(self.global_params, delta):
                g.grad = d.to(g.device).clone()
        with torch.no_grad(), self._lock:
            self.outer.step()
            self.outer.zero_grad(set_to_none=True)
            for p, g in zip(self.params, self.global_params):
                p.copy_(g)
            self.round += 1
        if group_size > 1:
            payload = sum(d.numel() for d in self.delta) * self.payload_bytes_per_value
            # butterfly all-reduce: each peer sends (n-1)/n of its vector to the other reducers, then sends its
            # averaged 1/n part back to the n-1 others; it receives the same amounts
            moved = int(2 * payload * (group_size - 1) / group_size)
            self.stats.bytes_sent += moved
            self.stats.bytes_received += moved
        self.stats.last_group_size = group_size
        self.stats.history.append((self.round - 1, group_size))
        self._start_round(mid_round=False)
        self.averager.state_sharing_priority = float(self.round)

    def shutdown(self) -> None:
        self._stop_publishing.set()
        self._publisher.join(timeout=5)
        try:  # tell the peers at once that we are gone, rather than letting our record expire
            self.board.publish(self.progress("left"))
        except Exception:
            pass
        if self.averager.is_alive():
            self.averager.shutdown()


def _ensure_fork() -> None:
    """hivemind's averager pickles callbacks unless processes are forked (see BASELINES.md); fail clearly."""
    if mp.get_start_method(allow_none=True) not in (None, "fork"):
        raise RuntimeError("cotrain needs the 'fork' multiprocessing start method for hivemind's averager")
