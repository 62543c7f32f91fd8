"""A round of a node's local training as a validator can replay it: where the round's steps began, and each step.

A replay (:mod:`cotrain.verification.replay`) runs the node's local steps again and compares where they lead with the
contribution the node sent. Steps are a function of more than the round's global parameters and the work unit, so
the node records, with verification on, at the round's first local step:

- the local model's parameters (the global ones, less what a lossy codec left unsent in the model: DiLoCo's error
  feedback; the validator bounds the difference);
- the inner optimizer's state (AdamW's moments carry over from round to round);
- the hidden state carried into the step (truncated backpropagation through time carries it from batch to batch);
- the state of torch's CPU random generator (dropout draws from it, on the training thread only);

and at each step its lr, whether the carried state was reset, and the byte ranges of the batch's rows in the
training split (:meth:`cotrain.data.streams.StreamBatches.last_ranges`).

Wire format (little-endian, appended to the evidence; every count bounded by what the validator's own model and
optimizer hold)::

    MAGIC | u64 numel, numel float32: start | u32 n, n x (u32 k, k x (u64 m, m float32)): optimizer, per parameter
          | u32 n, n x (u64 m, m float32): carried | u32 len, rng | u8 device (0 cpu, 1 another) | u32 steps,
          steps x (f64 lr, u8 reset,
          u32 rows, rows x (u64 start, u64 end))

Bytes from a peer are hostile: :func:`decode_trace` raises :class:`TraceError` naming the field at fault.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
from torch.utils import _pytree

MAGIC = b"CTT1"
#: local steps a trace holds at most: a round's H steps, and those of the tries after a failed one (the node trains
#: on between them); a longer round is not replayable and is sent without a trace
MAX_STEPS = 4096
#: rows a step's batch holds at most (``data.batch_size``'s bound)
MAX_ROWS = 4096
#: the size of torch's CPU generator state (a Mersenne twister)
RNG_BYTES = 5056
#: where the steps ran: dropout on a GPU draws from that device's generator, which the trace does not hold
DEVICES = ("cpu", "other")


class TraceError(ValueError):
    """A trace that is malformed, or not of the validator's model; the message names the field."""


@dataclass(frozen=True)
class Step:
    lr: float
    reset: bool  # the carried hidden state was dropped before this step (a new unit, or the streams wrapped)
    rows: tuple[tuple[int, int], ...]  # the byte ranges of the batch's rows, in the batch's order


@dataclass(frozen=True)
class Trace:
    start: torch.Tensor  # flat float32: the local model's parameters before the round's first step
    optimizer: tuple[tuple[torch.Tensor, ...], ...]  # per parameter, its state's tensors by sorted key (none: empty)
    carried: tuple[torch.Tensor, ...]  # the hidden state's tensors (none: no state carried in)
    rng: bytes
    steps: tuple[Step, ...]
    device: str = "cpu"  # one of DEVICES


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[tuple[torch.Tensor, ...], ...]:
    """The optimizer's state as tensors, per parameter in its param groups' order, each parameter's by sorted key
    (a parameter with no state yet: none). Values are copied."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            out.append(tuple(state[k].detach().clone() for k in sorted(state) if isinstance(state[k], torch.Tensor)))
    return tuple(out)


def state_tensors(state) -> tuple[torch.Tensor, ...]:
    """The tensors of a model's carried hidden state (None: none)."""
    if state is None:
        return ()
    leaves, _ = _pytree.tree_flatten(state)
    return tuple(t.detach().clone() for t in leaves if isinstance(t, torch.Tensor))


class TraceRecorder:
    """Records the current round's trace on the node's training thread: :meth:`before_step` before every local step,
    :meth:`take` when the round's contribution is sent (on the same thread: rounds that overlap training are not
    traced)."""

    def __init__(self, max_steps: int = MAX_STEPS):
        self.max_steps = max_steps
        self._round: Optional[int] = None
        self._begun: Optional[tuple] = None  # (start, optimizer, carried, rng, device)
        self._steps: list[Step] = []

    def before_step(self, round_number: int, steps_taken: int, params: Sequence[torch.Tensor],
                    optimizer: torch.optim.Optimizer, carried, lr: float, rows: Sequence[tuple[int, int]]) -> None:
        """The step about to be taken: step ``steps_taken`` of round ``round_number``, from ``params`` with
        ``optimizer`` and the hidden state ``carried`` (None: reset), at ``lr``, on the batch whose rows are
        ``rows``. The round's first step (``steps_taken`` 0, or a new round) snapshots where it begins."""
        if steps_taken == 0 or round_number != self._round or self._begun is None:
            start = torch.cat([p.detach().to(torch.float32).cpu().reshape(-1) for p in params])
            self._round, self._steps = round_number, []
            self._begun = (start, optimizer_tensors(optimizer), state_tensors(carried),
                           bytes(torch.get_rng_state().numpy().tobytes()),
                           "cpu" if params[0].device.type == "cpu" else "other")
        if len(self._steps) < self.max_steps:
            self._steps.append(Step(float(lr), carried is None, tuple((int(a), int(b)) for a, b in rows)))
        else:
            self._begun = None  # too long to replay: this round goes without a trace

    def take(self, round_number: int) -> Optional[Trace]:
        """The trace of ``round_number`` so far (its steps up to now), or None when it was not recorded whole."""
        if self._begun is None or self._round != round_number or not self._steps:
            return None
        start, optimizer, carried, rng, device = self._begun
        return Trace(start, optimizer, carried, rng, tuple(self._steps), device)


# ---- wire -------------------------------------------------------------------------------------------------------
def _f32(t: torch.Tensor) -> bytes:
    return t.detach().to(torch.float32).cpu().contiguous().numpy().astype("<f4", copy=False).tobytes()


def encode_trace(trace: Trace) -> bytes:
    out = [MAGIC, struct.pack("<Q", trace.start.numel()), _f32(trace.start), struct.pack("<I", len(trace.optimizer))]
    for tensors in trace.optimizer:
        out.append(struct.pack("<I", len(tensors)))
        out += [b for t in tensors for b in (struct.pack("<Q", t.numel()), _f32(t))]
    out.append(struct.pack("<I", len(trace.carried)))
    out += [b for t in trace.carried for b in (struct.pack("<Q", t.numel()), _f32(t))]
    out += [struct.pack("<I", len(trace.rng)), trace.rng, struct.pack("<BI", DEVICES.index(trace.device),
                                                                      len(trace.steps))]
    for s in trace.steps:
        out.append(struct.pack(f"<dBI{2 * len(s.rows)}Q", s.lr, int(s.reset), len(s.rows),
                               *[v for r in s.rows for v in r]))
    return b"".join(out)


def trace_bytes(numel: int, state_values: int, state_count: int, carried_values: int, carried_count: int,
                steps: int, rows: int) -> int:
    """The most bytes a trace takes for a model of ``numel`` values whose optimizer holds ``state_values`` values in
    ``state_count`` tensors and whose carried state holds ``carried_values`` in ``carried_count`` (a count and a
    size before each tensor, at most 16 bytes)."""
    return (len(MAGIC) + 8 + 4 * numel + 4 + 16 * state_count + 4 * state_values
            + 4 + 16 * carried_count + 4 * carried_values + 4 + RNG_BYTES + 1 + 4 + steps * (13 + 16 * rows))


class _Reader:
    def __init__(self, data: memoryview, pos: int):
        self.data, self.pos = data, pos

    def take(self, n: int, field: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise TraceError(f"evidence.trace.{field}: truncated ({len(self.data) - self.pos} of {n} bytes)")
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def unpack(self, fmt: str, field: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), field))

    def floats(self, field: str, most: int) -> torch.Tensor:
        (m,) = self.unpack("<Q", field)
        if m > most:
            raise TraceError(f"evidence.trace.{field}: {m} values, at most {most}")
        values = torch.from_numpy(np.frombuffer(self.take(4 * m, field), dtype="<f4").astype(np.float32))
        if not bool(torch.isfinite(values).all()):
            raise TraceError(f"evidence.trace.{field}: non-finite values")
        return values

    def tensors(self, field: str, numels: Sequence[int]) -> tuple[torch.Tensor, ...]:
        """A count, then that many tensors of ``numels``' sizes: none of them, or all."""
        (k,) = self.unpack("<I", field)
        if k not in (0, len(numels)):
            raise TraceError(f"evidence.trace.{field}: {k} tensors, expected 0 or {len(numels)}")
        out = tuple(self.floats(f"{field}[{j}]", m) for j, m in enumerate(numels[:k]))
        if any(t.numel() != m for t, m in zip(out, numels)):
            raise TraceError(f"evidence.trace.{field}: sizes {[t.numel() for t in out]}, expected {list(numels)}")
        return out


def decode_trace(data: memoryview, pos: int, numel: int, optimizer_numels: Sequence[Sequence[int]],
                 carried_numels: Sequence[int], max_rows: int = MAX_ROWS) -> Trace:
    """The trace in ``data[pos:]`` (all of it: no trailing bytes), for a model of ``numel`` values whose optimizer's
    state holds, per parameter, tensors of ``optimizer_numels`` values (a parameter may also come with none) and whose
    carried state holds tensors of ``carried_numels`` (or none). Shapes are the replayer's to restore."""
    r = _Reader(data, pos)
    if bytes(r.take(len(MAGIC), "magic")) != MAGIC:
        raise TraceError("evidence.trace.magic: not a cotrain trace")
    start = r.floats("start", numel)
    if start.numel() != numel:
        raise TraceError(f"evidence.trace.start: {start.numel()} values, this run's model has {numel}")
    (n,) = r.unpack("<I", "optimizer")
    if n != len(optimizer_numels):
        raise TraceError(f"evidence.trace.optimizer: {n} parameters, the optimizer has {len(optimizer_numels)}")
    optimizer = tuple(r.tensors(f"optimizer[{i}]", numels) for i, numels in enumerate(optimizer_numels))
    carried = r.tensors("carried", carried_numels)
    (rng_len,) = r.unpack("<I", "rng")
    if rng_len != RNG_BYTES:
        raise TraceError(f"evidence.trace.rng: {rng_len} bytes, a generator's state is {RNG_BYTES}")
    rng = bytes(r.take(rng_len, "rng"))
    (device,) = r.unpack("<B", "device")
    if device >= len(DEVICES):
        raise TraceError(f"evidence.trace.device: {device} (0 to {len(DEVICES) - 1})")
    (count,) = r.unpack("<I", "steps")
    if not 1 <= count <= MAX_STEPS:
        raise TraceError(f"evidence.trace.steps: {count} steps (1 to {MAX_STEPS})")
    steps = []
    for i in range(count):
        lr, reset, rows = r.unpack("<dBI", f"steps[{i}]")
        if not (lr == lr and 0.0 <= lr < 1e3) or reset > 1:
            raise TraceError(f"evidence.trace.steps[{i}]: lr {lr}, reset {reset}")
        if not 1 <= rows <= max_rows:
            raise TraceError(f"evidence.trace.steps[{i}].rows: {rows} rows (1 to {max_rows})")
        values = r.unpack(f"<{2 * rows}Q", f"steps[{i}].rows")
        steps.append(Step(lr, bool(reset), tuple(zip(values[::2], values[1::2]))))
    if r.pos != len(data):
        raise TraceError(f"evidence.trace: {len(data) - r.pos} trailing bytes")
    return Trace(start, optimizer, carried, rng, tuple(steps), DEVICES[device])
