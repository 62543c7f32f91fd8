"""Replaying a member's round of local training, and comparing its claimed contribution with the replay: the same
direction, about the same norm.

A validator replays a member's local steps from the round's trace (:mod:`cotrain.verification.trace`: where the
steps began, the optimizer's and the generator's state, each step's lr and batch rows) with the run's model, inner
optimizer and task (:class:`Replayer`, the node's training step), and compares what the member claimed with what it
got (:func:`judge`).
The replay repeats the same arithmetic; what differs between two honest runs is summation order (other kernels,
other hardware), which moves the result by a fraction of a percent on a model that trains stably. An update shifted
in one direction ("a little is enough"), trained on other data, scaled, noise or zeros lands far outside that.

Compare like with like: a contribution that travels compressed is compared with the replay passed through the same
codec, or both are compared decompressed before compression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch.utils import _pytree

from cotrain.verification.trace import Trace, TraceError, decode_trace, optimizer_tensors, trace_bytes

#: replays differ by rounding only (50 AdamW steps of a small MLP in float32 and in float64 agree to a cosine of
#: 1 - 4e-11); 0.99 leaves room for bf16 and long H, and fails an update whose part off the replay's direction is a
#: seventh of its norm or more. Calibrate per model with bench/verify.py, on the hardware validators use
MIN_COSINE = 0.99
#: the claimed norm over the replayed one: the same arithmetic gives the same norm within a few percent; a scaled
#: update (x10, x0.1) is far outside
NORM_RATIO_BOUNDS = (0.95, 1.05)
#: how far a round's local steps may begin from its global parameters, as a share of the replayed update's norm, by
#: codec: DiLoCo keeps what a lossy codec left unsent in the local model (error feedback), so the steps begin from
#: the global parameters less that residue; lossless: nothing. A codec that leaves most of an update unsent (top-k,
#: the sparse codec, PowerSGD) gives the start no bound, and such rounds are not replayed
START_SLACK = {"none": 1e-5, "fp16": 0.01, "int8": 0.05, "int4": 0.2}
#: inner optimizers whose state a trace restores (their state is per parameter tensors only)
REPLAYABLE_OPTIMIZERS = ("adamw",)


@dataclass(frozen=True)
class Comparison:
    """Claimed against replayed. ``cosine`` is nan when either is all zeros; ``norm_ratio`` is claimed over replayed
    (inf when only the replay is zero, nan when both are)."""
    verdict: str  # "pass" or "fail"
    reason: str
    cosine: float = math.nan
    norm_ratio: float = math.nan
    claimed_norm: float = math.nan
    replayed_norm: float = math.nan

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


def _mismatch(claimed: Sequence[torch.Tensor], replayed: Sequence[torch.Tensor]) -> str:
    if len(claimed) != len(replayed):
        return f"claimed: {len(claimed)} tensors, the replay has {len(replayed)}"
    for i, (c, r) in enumerate(zip(claimed, replayed)):
        if not isinstance(c, torch.Tensor) or not c.is_floating_point():
            return f"claimed[{i}]: not a floating-point tensor"
        if c.shape != r.shape:
            return f"claimed[{i}]: shape {tuple(c.shape)}, the replay's is {tuple(r.shape)}"
        if not bool(torch.isfinite(c).all()):
            return f"claimed[{i}]: non-finite values"
    return ""


def compare(claimed: Sequence[torch.Tensor], replayed: Sequence[torch.Tensor], *, min_cosine: float = MIN_COSINE,
            norm_ratio_bounds: tuple[float, float] = NORM_RATIO_BOUNDS) -> Comparison:
    """Whether ``claimed`` (a member's contribution, hostile) agrees with ``replayed`` (the validator's) in direction
    (cosine similarity of the flattened vectors at least ``min_cosine``) and norm (claimed over replayed within
    ``norm_ratio_bounds``). Sums are taken in float64, tensor by tensor, without concatenating the model.

    ValueError: bad thresholds, or a non-finite replay (the validator's, not the member's, fault)."""
    low, high = norm_ratio_bounds
    if not -1.0 <= min_cosine <= 1.0:
        raise ValueError(f"min_cosine: expected a number in [-1, 1], got {min_cosine}")
    if not 0.0 < low <= 1.0 <= high < math.inf:
        raise ValueError(f"norm_ratio_bounds: expected 0 < low <= 1 <= high, got {norm_ratio_bounds}")
    if not all(bool(torch.isfinite(r).all()) for r in replayed):
        raise ValueError("replayed: non-finite values")
    why = _mismatch(claimed, replayed)
    if why:
        return Comparison("fail", why)
    dot = claimed_sq = replayed_sq = 0.0
    for c, r in zip(claimed, replayed):
        c64, r64 = c.detach().to(torch.float64).flatten(), r.detach().to(torch.float64).flatten()
        dot += float(c64 @ r64)
        claimed_sq += float(c64 @ c64)
        replayed_sq += float(r64 @ r64)
    claimed_norm, replayed_norm = math.sqrt(claimed_sq), math.sqrt(replayed_sq)
    norms = dict(claimed_norm=claimed_norm, replayed_norm=replayed_norm)
    if claimed_norm == 0.0 and replayed_norm == 0.0:
        return Comparison("pass", "both are all zeros: nothing to train on", **norms)
    if replayed_norm == 0.0:
        return Comparison("fail", f"claims an update of norm {claimed_norm:.3g} where the replay moved nothing",
                          norm_ratio=math.inf, **norms)
    ratio = claimed_norm / replayed_norm
    if claimed_norm == 0.0:
        return Comparison("fail", f"all-zero update where the replay moved by {replayed_norm:.3g}",
                          norm_ratio=ratio, **norms)
    cosine = max(-1.0, min(1.0, dot / (claimed_norm * replayed_norm)))
    figures = dict(cosine=cosine, norm_ratio=ratio, **norms)
    if cosine < min_cosine:
        return Comparison("fail", f"points elsewhere than the replay: cosine {cosine:.4f} (at least {min_cosine})",
                          **figures)
    if not low <= ratio <= high:
        return Comparison("fail", f"{ratio:.3g} times the replay's norm (between {low} and {high})", **figures)
    return Comparison("pass", f"agrees with the replay: cosine {cosine:.4f}, {ratio:.3f} times its norm", **figures)


def not_replayable(cfg) -> str:
    """Why a run's rounds cannot be replayed ("" when they can)."""
    if cfg.model.is_world_model:
        return "world models' rollouts are not in the trace"
    if cfg.hosts_experts:
        return "the mixture's experts step on their hosts, not in the trace"
    if cfg.optimizer.kind not in REPLAYABLE_OPTIMIZERS:
        return f"optimizer.kind {cfg.optimizer.kind!r}: its state is not in the trace"
    if cfg.averaging.strategy != "diloco" or cfg.averaging.overlap:
        return "only DiLoCo rounds that do not overlap training are traced"
    if cfg.compression.kind not in START_SLACK:
        return f"compression.kind {cfg.compression.kind!r} leaves most of an update in the local model"
    return ""


def judge(contribution: torch.Tensor, global_params: torch.Tensor, trace: Trace, replayed: torch.Tensor,
          start_slack: float, **bounds) -> Comparison:
    """A member's ``contribution`` (flat, as its group took it in: the round's global parameters less its local
    model's) against the ``replayed`` progress (flat: the trace's start less where the replay ended). The claimed
    progress is the contribution less what lay between the global parameters and the trace's start; that gap may be
    at most ``start_slack`` of the replayed progress's norm (a start far from the global parameters would let a
    member steer where honest steps end)."""
    offset = global_params - trace.start
    gap, moved = float(offset.double().norm()), float(replayed.double().norm())
    if gap > start_slack * moved + 1e-7 * float(global_params.double().norm()):
        return Comparison("fail", f"the round's steps began {gap:.3g} from its global parameters, more than "
                          f"{start_slack:g} of the {moved:.3g} they moved")
    return compare([contribution - offset], [replayed], **bounds)


class Replayer:
    """A round's local steps again, from a trace, with the run's model, inner optimizer and training step, on this
    CPU. ``read(offset, length)``: bytes of the training split (the corpus the coordinator serves)."""

    def __init__(self, cfg, read: Callable[[int, int], bytes]):
        from cotrain.optim import build_optimizer
        from cotrain.tasks import build_task

        self.cfg, self.read, self._build_optimizer = cfg, read, build_optimizer
        self.task = build_task(cfg)
        self.model = self.task.build_model(None)
        self.params = list(self.model.parameters())
        self.numel = sum(p.numel() for p in self.params)
        template = self._optimizer(with_state=True)
        self.optimizer_numels = [[t.numel() for t in ts] for ts in optimizer_tensors(template)]
        with torch.no_grad():
            _, carried = self.model(torch.zeros(cfg.data.batch_size, 1, dtype=torch.long), None)
        leaves, self._carried_spec = _pytree.tree_flatten(carried)
        self._carried_shapes = [t.shape for t in leaves]

    def _optimizer(self, with_state: bool) -> torch.optim.Optimizer:
        optimizer = self._build_optimizer(self.model, self.cfg.optimizer)
        if with_state:  # a step on zero gradients makes every parameter's state (its values are set after)
            saved = [p.detach().clone() for p in self.params]
            for p in self.params:
                p.grad = torch.zeros_like(p)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for p, s in zip(self.params, saved):
                    p.copy_(s)
        return optimizer

    def max_trace_bytes(self, max_steps: int) -> int:
        """The most bytes a trace of this run's model takes."""
        numels = [m for ms in self.optimizer_numels for m in ms]
        shapes = [math.prod(s) for s in self._carried_shapes]
        return trace_bytes(self.numel, sum(numels), len(numels), sum(shapes), len(shapes), max_steps,
                           self.cfg.data.batch_size)

    def decode(self, data: memoryview, pos: int) -> Trace:
        return decode_trace(data, pos, self.numel, self.optimizer_numels, [math.prod(s) for s in self._carried_shapes],
                            max_rows=self.cfg.data.batch_size)

    def _batch(self, rows: Sequence[tuple[int, int]], index: int):
        length = self.cfg.data.seq_len + 1
        if len(rows) != self.cfg.data.batch_size:
            raise TraceError(f"evidence.trace.steps[{index}].rows: {len(rows)} rows, the run's batch has "
                             f"{self.cfg.data.batch_size}")
        data = []
        for a, b in rows:
            piece = self.read(a, b - a) if b - a == length else b""
            if len(piece) != length:
                raise TraceError(f"evidence.trace.steps[{index}].rows: [{a}, {b}) is not a row of {length} bytes "
                                 "of the training split")
            data.append(piece)
        tokens = torch.frombuffer(bytearray(b"".join(data)), dtype=torch.uint8).view(len(rows), length).long()
        return tokens[:, :-1], tokens[:, 1:]

    def replay(self, trace: Trace) -> torch.Tensor:
        """The progress of the trace's steps (flat: its start less where they end). TraceError: a row that is not
        one of the training split, or a generator state torch refuses."""
        offsets = [0]
        for p in self.params:
            offsets.append(offsets[-1] + p.numel())
        with torch.no_grad():
            for i, p in enumerate(self.params):
                p.copy_(trace.start[offsets[i]:offsets[i + 1]].view_as(p))
        optimizer = self._optimizer(with_state=any(trace.optimizer))
        for p, tensors in zip((p for g in optimizer.param_groups for p in g["params"]), trace.optimizer):
            state = optimizer.state.get(p, {})
            keys = [k for k in sorted(state) if isinstance(state[k], torch.Tensor)]
            if not tensors:
                optimizer.state.pop(p, None)
                continue
            for key, values in zip(keys, tensors):
                state[key].copy_(values.view_as(state[key]).to(state[key].dtype))
        carried: Optional[object] = None
        if trace.carried:
            carried = _pytree.tree_unflatten([t.view(s) for t, s in zip(trace.carried, self._carried_shapes)],
                                             self._carried_spec)
        self.model.train()
        grad_clip = self.cfg.optimizer.grad_clip
        with torch.random.fork_rng(devices=[]):
            try:
                torch.set_rng_state(torch.frombuffer(bytearray(trace.rng), dtype=torch.uint8))
            except RuntimeError as e:
                raise TraceError(f"evidence.trace.rng: {e}") from None
            for i, step in enumerate(trace.steps):
                batch = self._batch(step.rows, i)
                if step.reset:
                    carried = None
                for group in optimizer.param_groups:
                    group["lr"] = step.lr
                loss, carried, _ = self.task.step(self.model, batch, carried, torch.device("cpu"))
                optimizer.zero_grad(set_to_none=True)
                if math.isfinite(loss.item()):  # the node drops a step whose loss is not finite
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(self.params, grad_clip)
                    optimizer.step()
                carried = self.model.detach_state(carried)
        end = torch.cat([p.detach().reshape(-1) for p in self.params])
        return trace.start - end

