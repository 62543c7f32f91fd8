"""What a reducer saw of its groupmates' contributions, so that a member's evidence is bound to what its group averaged.

A validator checks the contribution a member uploads as evidence (:mod:`cotrain.verification.evidence`). Without a
binding, a member could send its group one contribution and the validator an honest other. So every reducer with
verification on notes, for each member's part it took in, the digest of the values it decoded (:func:`part_digest`,
over float32 little-endian, as the commitment is made) and where the part lies in the flat contribution
(:class:`PartSeen`); its heartbeats carry those of its last rounds to the coordinator. The validator cuts the same
slice out of the member's evidence and compares digests (:func:`contradicting`): a member whose evidence differs from
what a reducer took in sent its group something else, or the reducer lies. One reducer's word could frame an honest
member, so a contradiction counts only once :data:`MIN_WITNESSES` distinct reducers have made one
(:func:`binding_counts`): an attacker that sends its group another contribution is contradicted by each reducer in
turn (the host and the butterfly's parts move round to round), one lying reducer never gets a member failed.

Reports come from peers and are hostile: :func:`check_part_seen` bounds every field and names the one at fault.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple, Sequence

import torch


#: parts a heartbeat carries at most: a reducer's last two rounds of a group of 32
MAX_PARTS_SEEN = 64
DIGEST_BYTES = 32
#: a peer id is a base58 multihash (52 characters for an ed25519 key); the bound only keeps hostile input small
MAX_MEMBER_CHARS = 128
#: a flat contribution's values at most (a model of 2^40 parameters is beyond any volunteer's)
MAX_VALUES = 1 << 40
#: distinct reducers that must contradict a member's evidence before it fails a check that counts: with 2, a single
#: lying reducer cannot frame a member, two colluding ones can
MIN_WITNESSES = 2


class PartSeen(NamedTuple):
    """A reducer's report: in ``round``, ``member`` sent it the values [start, end) of its contribution, whose
    :func:`part_digest` is ``digest``."""
    round: int
    member: str
    start: int
    end: int
    digest: bytes


def contribution_bytes(flat: torch.Tensor) -> bytes:
    """The bytes commitments and digests are made over: float32, little-endian."""
    return flat.detach().to(torch.float32).cpu().contiguous().numpy().astype("<f4", copy=False).tobytes()


def part_digest(values: torch.Tensor) -> bytes:
    return hashlib.sha256(contribution_bytes(values.reshape(-1))).digest()


def check_part_seen(part: PartSeen) -> str:
    """"" for a well-formed report, else what is wrong with it, naming the field."""
    if not 0 < part.round < 2 ** 63:
        return f"parts_seen.round: {part.round}"
    if not part.member or len(part.member) > MAX_MEMBER_CHARS:
        return f"parts_seen.member: {len(part.member)} characters (1 to {MAX_MEMBER_CHARS})"
    if not 0 <= part.start < part.end <= MAX_VALUES:
        return f"parts_seen.start, end: [{part.start}, {part.end}) is no part of a contribution"
    if len(part.digest) != DIGEST_BYTES:
        return f"parts_seen.digest: {len(part.digest)} bytes, expected {DIGEST_BYTES}"
    return ""


def contradicting(contribution: torch.Tensor, seen: Sequence[tuple[str, PartSeen]]) -> list[tuple[str, str]]:
    """The reducers whose reports ``contribution`` (a member's evidence, flat) contradicts, with what differs in
    words: ``seen``, (reducer, its report) for the member's round. Empty: every part matches."""
    numel, out = contribution.numel(), []
    for reducer, part in seen:
        if part.end > numel:
            out.append((reducer, f"reducer {reducer[:8]} took in values [{part.start}, {part.end}) of a contribution "
                                 f"of {numel}"))
        elif part_digest(contribution[part.start:part.end]) != part.digest:
            out.append((reducer, f"values [{part.start}, {part.end}) differ from what reducer {reducer[:8]} took in"))
    return out


def binding_counts(contradicted_by: set[str]) -> bool:
    """Whether a member whose evidence these distinct reducers contradicted (lately) fails a check that counts."""
    return len(contradicted_by) >= MIN_WITNESSES
