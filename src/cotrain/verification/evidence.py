"""A member's evidence of one round's contribution, kept for a validator: the round's global parameters, the
contribution the group decoded, and the member's signed commitment to it.

A node keeps the evidence of its last few rounds (:class:`EvidenceKeeper`); when a validator asks for a round's, the
node sends it (:func:`encode_evidence`), and the validator checks it (:func:`decode_evidence`) before scoring the
contribution against the parameters (:func:`cotrain.verification.score.loss_score`). The commitment is signed with
the node's record key, whose public half its credential names, so a score is attributable to the node and to
nothing else; the commitment covers the contribution's exact bytes (float32, little-endian).

The evidence also names the bytes of the training split the node read since its previous round's evidence (its
batches' ranges, merged): the validator checks that they lie in the node's work units and scores the contribution on
them, where an honest node's update must lower the loss.

With the round's trace (:mod:`cotrain.verification.trace`), a validator can also replay the round's local steps.

Wire format (little-endian; every length bounded, no trailing bytes)::

    MAGIC | u64 round | u16 len, state hash (ascii) | u32 len, commitment | u32 n, n x (u64 start, u64 end): reads
          | u64 numel | numel float32: the global parameters, flat, in the model's order | numel float32: the
          contribution | optional: the trace (its own MAGIC first)

Bytes from a peer are hostile: :func:`decode_evidence` takes the number of values the validator's own model has and
raises :class:`EvidenceError` naming the field at fault (never anything else).
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from cotrain.verification.commitment import MAX_COMMITMENT_BYTES, commit, encode_commitment
from cotrain.verification.trace import Trace, TraceError, TraceRecorder, encode_trace
from cotrain.verification.witness import MAX_PARTS_SEEN, PartSeen, contribution_bytes

MAGIC = b"CTE1"
#: a state hash is a hex digest (sha256: 64 characters); the bound only keeps hostile input small
MAX_HASH_CHARS = 128
#: rounds whose evidence a node keeps: a validator asks for the latest round it heard of, which a node that went on
#: has finished by the time the request comes back on its next heartbeat
KEEP_ROUNDS = 3
#: read ranges a round's evidence names at most: a batch reads one range a stream, and a stream's consecutive batches
#: merge into one range, so a round holds about one a stream (two where a unit ends); more are dropped, oldest first
MAX_READS = 1024


class EvidenceError(ValueError):
    """Evidence that is malformed, or not of the validator's model; the message names the field."""


@dataclass(frozen=True)
class Evidence:
    round: int
    state_hash: str
    commitment: bytes  # encoded (:func:`cotrain.verification.commitment.encode_commitment`)
    params: torch.Tensor  # flat float32: the round's global parameters
    contribution: torch.Tensor  # flat float32: the contribution as the group decoded it
    reads: tuple[tuple[int, int], ...] = ()  # byte ranges of the training split read for it, sorted, disjoint
    trace: Optional[Trace] = None  # the round's local steps, for a replay (None: not recorded)

    @property
    def contribution_bytes(self) -> bytes:
        """The bytes the commitment is made to."""
        return contribution_bytes(self.contribution)


def evidence_bytes(numel: int) -> int:
    """The most bytes the evidence of a model of ``numel`` values takes: what a validator takes in at most."""
    return len(MAGIC) + 8 + 2 + MAX_HASH_CHARS + 4 + MAX_COMMITMENT_BYTES + 4 + 16 * MAX_READS + 8 + 8 * numel


def encode_evidence(ev: Evidence) -> bytes:
    state_hash = ev.state_hash.encode("ascii")
    if len(state_hash) > MAX_HASH_CHARS:
        raise ValueError(f"evidence.state_hash: {len(state_hash)} characters (at most {MAX_HASH_CHARS})")
    if ev.params.numel() != ev.contribution.numel():
        raise ValueError(f"evidence.contribution: {ev.contribution.numel()} values, the parameters "
                         f"{ev.params.numel()}")
    if len(ev.reads) > MAX_READS:
        raise ValueError(f"evidence.reads: {len(ev.reads)} ranges (at most {MAX_READS})")
    reads = struct.pack(f"<I{2 * len(ev.reads)}Q", len(ev.reads), *[v for r in ev.reads for v in r])
    return b"".join([MAGIC, struct.pack("<QH", ev.round, len(state_hash)), state_hash,
                     struct.pack("<I", len(ev.commitment)), ev.commitment, reads, struct.pack("<Q", ev.params.numel()),
                     contribution_bytes(ev.params), ev.contribution_bytes,
                     encode_trace(ev.trace) if ev.trace is not None else b""])


#: reads a trace from ``data`` at ``pos`` to its end (:meth:`cotrain.verification.replay.Replayer.decode`)
TraceDecoder = Callable[[memoryview, int], Trace]


def decode_evidence(data: bytes, numel: int, trace: Optional[TraceDecoder] = None, trace_bytes: int = 0) -> Evidence:
    """The evidence in ``data`` (from a peer) for a model of ``numel`` values; a trace after it is read with
    ``trace`` (of at most ``trace_bytes``; without a decoder, trailing bytes are refused). The commitment is bounded
    here, not checked: :func:`cotrain.verification.commitment.verify_commitment` and ``matches`` do that."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise EvidenceError(f"evidence: expected bytes, got {type(data).__name__}")
    data = memoryview(bytes(data))
    most = evidence_bytes(numel) + (trace_bytes if trace is not None else 0)
    if len(data) > most:
        raise EvidenceError(f"evidence: {len(data)} bytes, at most {most} for this model")
    pos = 0

    def take(n: int, field: str) -> memoryview:
        nonlocal pos
        if pos + n > len(data):
            raise EvidenceError(f"evidence.{field}: truncated ({len(data) - pos} of {n} bytes)")
        pos += n
        return data[pos - n:pos]

    if bytes(take(len(MAGIC), "magic")) != MAGIC:
        raise EvidenceError("evidence.magic: not cotrain evidence")
    round_, hash_len = struct.unpack("<QH", take(10, "round"))
    if hash_len > MAX_HASH_CHARS:
        raise EvidenceError(f"evidence.state_hash: {hash_len} characters (at most {MAX_HASH_CHARS})")
    try:
        state_hash = bytes(take(hash_len, "state_hash")).decode("ascii")
    except UnicodeDecodeError:
        raise EvidenceError("evidence.state_hash: not ascii") from None
    (commitment_len,) = struct.unpack("<I", take(4, "commitment"))
    if not 1 <= commitment_len <= MAX_COMMITMENT_BYTES:
        raise EvidenceError(f"evidence.commitment: {commitment_len} bytes (1 to {MAX_COMMITMENT_BYTES})")
    commitment = bytes(take(commitment_len, "commitment"))
    (n_reads,) = struct.unpack("<I", take(4, "reads"))
    if n_reads > MAX_READS:
        raise EvidenceError(f"evidence.reads: {n_reads} ranges (at most {MAX_READS})")
    values = struct.unpack(f"<{2 * n_reads}Q", take(16 * n_reads, "reads"))
    reads = tuple(zip(values[::2], values[1::2]))
    if any(a >= b for a, b in reads) or any(reads[i][1] > reads[i + 1][0] for i in range(len(reads) - 1)):
        raise EvidenceError("evidence.reads: ranges must be non-empty, sorted and disjoint")
    (count,) = struct.unpack("<Q", take(8, "numel"))
    if count != numel:
        raise EvidenceError(f"evidence.numel: {count} values, this run's model has {numel}")
    params = _floats(take(4 * numel, "params"))
    contribution = _floats(take(4 * numel, "contribution"))
    traced = None
    if pos != len(data) and trace is not None:
        try:
            traced = trace(data, pos)
        except TraceError as e:
            raise EvidenceError(str(e)) from None
    elif pos != len(data):
        raise EvidenceError(f"evidence: {len(data) - pos} trailing bytes")
    if not bool(torch.isfinite(params).all()):
        raise EvidenceError("evidence.params: non-finite values")
    return Evidence(round_, state_hash, commitment, params, contribution, reads, traced)


def _floats(raw: memoryview) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(raw, dtype="<f4").astype(np.float32))


def merged(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` sorted, with those that overlap or touch made one."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().to(torch.float32).cpu().reshape(-1) for t in tensors])


class EvidenceKeeper:
    """A node's evidence of its last :data:`KEEP_ROUNDS` rounds, each committed (signed with ``key``, the node's
    record key) as it is kept, and what it reduced of its groupmates' contributions in its last two rounds (the
    reports that bind their evidence: :mod:`cotrain.verification.witness`). :meth:`keep` runs on the round's thread,
    :meth:`latest`, :meth:`encoded` and :meth:`parts_seen` on the heartbeat's: everything is under one lock."""

    def __init__(self, key, run_id: str, peer_id: str, keep_rounds: int = KEEP_ROUNDS, traced: bool = False):
        """``traced``: each round's evidence carries its trace, for a replay: the node's training loop feeds
        :attr:`recorder` (on the thread that keeps the evidence too: rounds that do not overlap training)."""
        self.key, self.run_id, self.peer_id, self.keep_rounds = key, run_id, peer_id, keep_rounds
        self.recorder: Optional[TraceRecorder] = TraceRecorder() if traced else None
        self._lock = threading.Lock()
        self._kept: OrderedDict[int, Evidence] = OrderedDict()
        self._reads: list[tuple[int, int]] = []  # read since the last evidence kept, merged
        self._seen: OrderedDict[int, tuple[PartSeen, ...]] = OrderedDict()  # round -> its parts seen, newest last

    def keep(self, round_number: int, state_hash: str, params: Sequence[torch.Tensor],
             contribution: torch.Tensor, seen: Sequence[PartSeen] = ()) -> None:
        """The evidence of ``round_number``: the round's global ``params`` and ``contribution`` (flat, as the group
        decoded it), committed now; ``seen``: what this node reduced of its groupmates' contributions."""
        ev_params, ev_contribution = flat(params), flat([contribution])
        signed = commit(self.key, run_id=self.run_id, round=round_number, peer_id=self.peer_id,
                        contribution=contribution_bytes(ev_contribution))
        with self._lock:
            reads, self._reads = tuple(self._reads[-MAX_READS:]), []
            trace = self.recorder.take(round_number) if self.recorder is not None else None
            ev = Evidence(round_number, state_hash, encode_commitment(signed), ev_params, ev_contribution, reads,
                          trace)
            self._kept[round_number] = ev
            self._kept.move_to_end(round_number)
            while len(self._kept) > self.keep_rounds:
                self._kept.popitem(last=False)
            if seen and round_number > 0:  # round 0's evidence is asked for by no one, and reports of it are refused
                self._seen[round_number] = tuple(seen)
                self._seen.move_to_end(round_number)
                while len(self._seen) > 2:
                    self._seen.popitem(last=False)

    def note_read(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Byte ranges of the training split a batch read (the main thread, every step)."""
        with self._lock:
            self._reads = merged(self._reads + [tuple(r) for r in ranges])[-MAX_READS:]

    def latest(self) -> int:
        """The latest round kept (0: none; round 0's evidence is asked for by no one)."""
        with self._lock:
            return max(self._kept, default=0)

    def commitments(self) -> list[bytes]:
        """The encoded commitments of the rounds kept, oldest first."""
        with self._lock:
            return [ev.commitment for ev in self._kept.values()]

    def parts_seen(self) -> list[PartSeen]:
        """What this node reduced of its groupmates' contributions in its last two rounds, the newest first, at most
        :data:`~cotrain.verification.witness.MAX_PARTS_SEEN`: each heartbeat carries them."""
        with self._lock:
            rounds = list(self._seen.items())
        return [part for _, parts in reversed(rounds) for part in parts][:MAX_PARTS_SEEN]

    def encoded(self, round_number: int) -> Optional[bytes]:
        """The evidence of ``round_number`` as a validator takes it in; None when it is not kept (any more)."""
        with self._lock:
            ev = self._kept.get(round_number)
        return None if ev is None else encode_evidence(ev)
