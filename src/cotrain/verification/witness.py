"""What a reducer saw of its groupmates' contributions, so that a member's evidence is bound to what its group averaged.

A validator checks the contribution a member uploads as evidence (:mod:`cotrain.verification.evidence`). Without a
binding, a member could send its group one contribution and the validator an honest other. So, with verification on:

- a member signs each part of its contribution it sends (:meth:`PartSigning.sign`): the run, the round, its peer id,
  the digest of the whole contribution the part is of (as its commitment is made: a round tried twice has two),
  where the part lies in it and the digest of the part's values as the reducer will decode them (:func:`part_digest`,
  float32 little-endian), with its record key;
- the reducer takes a part in only when the signature holds for what it decoded (:meth:`PartSigning.valid`, with
  the record key the member's credential names), and notes it (:class:`PartSeen`); its heartbeats carry those of its
  last rounds to the coordinator;
- the validator checks each report's signature with the member's record key (:func:`part_signed`) and judges the
  evidence against the reports of its round (:func:`binding`).

A report is the member's own signed word, so a reducer cannot frame a member. A member whose evidence contradicts a
report of the same contribution signed two different things; one whose reducers took in only other contributions
than the one it shows sent its group another (an honest member's failed try of a round is followed by the try that
succeeded, whose parts its reducers took in too). Reports come from peers and are hostile:
:func:`check_part_seen` bounds every field and names the one at fault.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Sequence

import torch
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

#: parts a heartbeat carries at most: a reducer's last two rounds of a group of 32
MAX_PARTS_SEEN = 64
DIGEST_BYTES = 32
#: a peer id is a base58 multihash (52 characters for an ed25519 key); the bound only keeps hostile input small
MAX_MEMBER_CHARS = 128
#: a flat contribution's values at most (a model of 2^40 parameters is beyond any volunteer's)
MAX_VALUES = 1 << 40
#: hivemind's RSA signatures are base64 of 256 bytes; the bound only keeps hostile input small
MAX_SIGNATURE_BYTES = 1024
DOMAIN = b"cotrain-part-v1"


class PartSeen(NamedTuple):
    """A reducer's report: in ``round``, ``member`` sent it the values [start, end) of its contribution whose
    :func:`part_digest` is ``contribution``; the part's is ``digest``; ``signature``: the member's, of all that
    (:func:`part_statement`)."""
    round: int
    member: str
    start: int
    end: int
    digest: bytes
    signature: bytes
    contribution: bytes


def contribution_bytes(flat: torch.Tensor) -> bytes:
    """The bytes commitments and digests are made over: float32, little-endian."""
    return flat.detach().to(torch.float32).cpu().contiguous().numpy().astype("<f4", copy=False).tobytes()


def part_digest(values: torch.Tensor) -> bytes:
    return hashlib.sha256(contribution_bytes(values.reshape(-1))).digest()


def part_statement(run_id: str, round: int, member: str, start: int, end: int, digest: bytes,
                   contribution: bytes) -> bytes:
    """What a member signs of a part it sends."""
    return b"|".join([DOMAIN, run_id.encode(), member.encode(), struct.pack("<QQQ", round, start, end), contribution,
                      digest])


def part_signed(public_key: Optional[bytes], run_id: str, part: PartSeen) -> bool:
    """Whether ``part``'s signature is the member's (``public_key``: the record key its credential names, OpenSSH
    encoding) over its statement in ``run_id``. False for a key or a signature that is none (hostile bytes)."""
    if not public_key or not part.signature or len(part.signature) > MAX_SIGNATURE_BYTES:
        return False
    try:
        key = RSAPublicKey.from_bytes(bytes(public_key))
        return bool(key.verify(part_statement(run_id, part.round, part.member, part.start, part.end, part.digest,
                                              part.contribution), part.signature))
    except Exception:  # noqa: BLE001 - the cryptography library raises several types for garbage
        return False


@dataclass(frozen=True)
class PartSigning:
    """A round's parts, signed as they go out and checked as they come in: ``me`` signs with ``key``; a member's
    signature is checked with the record key its credential names (``record_key_of``; None when it is not known:
    data-plane checks off, and then a part is taken in as it is)."""
    run_id: str
    round: int
    me: str
    key: RSAPrivateKey
    record_key_of: Callable[[str], Optional[bytes]]

    def sign(self, start: int, end: int, digest: bytes, contribution: bytes) -> bytes:
        """This peer's signature of the part [start, end) whose values, as its reducer decodes them, have the
        :func:`part_digest` ``digest``, of the contribution whose digest is ``contribution``."""
        return self.key.sign(part_statement(self.run_id, self.round, self.me, start, end, digest, contribution))

    def valid(self, part: PartSeen) -> bool:
        """Whether the member signed ``part`` (one of this round's)."""
        key = self.record_key_of(part.member)
        return key is None or part_signed(key, self.run_id, part)


def pack_signed(contribution: bytes, signature: bytes, encoded: bytes) -> bytes:
    """A part's encoded values after the digest of its contribution and its signature (length first)."""
    return contribution + struct.pack("<H", len(signature)) + signature + encoded


def unpack_signed(data: bytes) -> tuple[bytes, bytes, bytes]:
    """-> (the contribution's digest, the signature, the encoded values) of :func:`pack_signed`'s bytes (hostile);
    ValueError naming the field."""
    if len(data) < DIGEST_BYTES + 2:
        raise ValueError("signature: missing")
    (n,) = struct.unpack("<H", data[DIGEST_BYTES:DIGEST_BYTES + 2])
    at = DIGEST_BYTES + 2
    if not 0 < n <= MAX_SIGNATURE_BYTES or len(data) < at + n:
        raise ValueError(f"signature: {n} bytes (1 to {MAX_SIGNATURE_BYTES}, in a part of {len(data)})")
    return data[:DIGEST_BYTES], data[at:at + n], data[at + n:]


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
    if not 0 < len(part.signature) <= MAX_SIGNATURE_BYTES:
        return f"parts_seen.signature: {len(part.signature)} bytes (1 to {MAX_SIGNATURE_BYTES})"
    if len(part.contribution) != DIGEST_BYTES:
        return f"parts_seen.contribution: {len(part.contribution)} bytes, expected {DIGEST_BYTES}"
    return ""


def binding(contribution: torch.Tensor, seen: Sequence[tuple[str, PartSeen]]) -> str:
    """Whether ``contribution`` (a member's evidence of a round, flat) is what its group took in, judged by ``seen``:
    (reducer, its report) of every part of the member's round, each signed by the member. -> "" when it is (or
    nothing was reported), else why not in words. The reports of the evidence's own contribution must each match its
    slice; reports of other contributions only (none of this one) mean its reducers took in another than it shows."""
    if not seen:
        return ""
    shown = part_digest(contribution)
    own = [(reducer, part) for reducer, part in seen if part.contribution == shown]
    if not own:
        reducer, part = seen[0]
        return (f"reducer {reducer[:8]} took in a part of another contribution ({part.contribution.hex()[:12]}) than "
                f"the one it shows ({shown.hex()[:12]}), and no reducer took in one of this")
    numel = contribution.numel()
    for reducer, part in own:
        if part.end > numel or part_digest(contribution[part.start:part.end]) != part.digest:
            return (f"values [{part.start}, {part.end}) differ from those it signed and reducer {reducer[:8]} took "
                    "in")
    return ""
