"""A peer's commitment to its contribution: the sha256 of the contribution's exact bytes, with the run, the round and
the peer, signed with the peer's record key.

A peer publishes its commitment before the all-reduce reveals its contribution. Every contribution then has an
author fixed in advance: bytes that match an earlier round's commitment are a stale or copied update, and bytes that
match another peer's commitment of the same round were shared between the two (:func:`find_copies`).

The key is the one that signs the peer's progress records (:func:`cotrain.averaging.dht.load_record_key`, a hivemind
``RSAPrivateKey``); its public half is the ``record_public_key`` of the peer's credential (OpenSSH encoding, as
hivemind's ``RSAPublicKey.to_bytes`` writes it), so a verifier trusts a commitment exactly as far as it trusts the
credential that names the key.

Wire format (big-endian; every length bounded, no trailing bytes)::

    MAGIC | u16 len, run_id (utf-8) | u64 round | u16 len, peer_id (utf-8) | 32 bytes sha256 | u64 size
          | u16 len, signature

The signature (hivemind's: base64 of RSA-PSS over SHA-256) covers ``DOMAIN`` followed by every byte before the
signature's length. Bytes from peers are hostile: :func:`decode_commitment`, :func:`verify_commitment` and
:func:`matches` return a :class:`Checked` whose reason names the field at fault, and raise nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import Iterable, Optional

from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

MAGIC = b"CTC1"
#: signatures of commitments cannot be replayed as signatures of anything else this key signs (progress records)
DOMAIN = b"cotrain-commitment-v1"
DIGEST_BYTES = 32
#: run ids are the run's name and 8 hex digits; the bound only keeps hostile input small
MAX_RUN_ID_BYTES = 256
#: libp2p peer ids in base58 are 46 to 52 characters
MAX_PEER_ID_BYTES = 128
#: hivemind's RSA-2048 signature in base64 is 344 bytes; room for a 4096-bit key's 684
MAX_SIGNATURE_BYTES = 1024
#: an RSA-2048 public key in OpenSSH encoding is about 380 bytes
MAX_PUBLIC_KEY_BYTES = 4096
MAX_ROUND = 2**63 - 1
#: 1 TiB: far above any compressed pseudo-gradient; a sanity bound on the size field, not a policy
MAX_CONTRIBUTION_BYTES = 1 << 40
#: the largest encoding the bounds above allow
MAX_COMMITMENT_BYTES = (len(MAGIC) + 2 + MAX_RUN_ID_BYTES + 8 + 2 + MAX_PEER_ID_BYTES + DIGEST_BYTES + 8
                        + 2 + MAX_SIGNATURE_BYTES)


@dataclass(frozen=True)
class Commitment:
    run_id: str
    round: int
    peer_id: str
    #: sha256 of the contribution's exact bytes
    digest: bytes
    #: the contribution's length in bytes
    size: int
    signature: bytes = b""


@dataclass(frozen=True)
class Checked:
    """The outcome of a check: ``ok``, or why not, in words that name the field at fault."""
    ok: bool
    reason: str
    commitment: Optional[Commitment] = None


@dataclass(frozen=True)
class Copy:
    """A commitment whose digest another commitment of the same run already holds."""
    peer_id: str
    round: int
    of_peer_id: str
    of_round: int
    reason: str


class _Malformed(ValueError):
    pass


# ---- encoding --------------------------------------------------------------------------------------------------------
def _body(c: Commitment) -> bytes:
    """The signed part of the encoding; ValueError naming the field when a value is out of bounds."""
    run_id, peer_id = c.run_id.encode(), c.peer_id.encode()
    for field, value, limit in (("run_id", run_id, MAX_RUN_ID_BYTES), ("peer_id", peer_id, MAX_PEER_ID_BYTES)):
        if not value or len(value) > limit:
            raise ValueError(f"commitment.{field}: {len(value)} bytes (1 to {limit})")
    if not 0 <= c.round <= MAX_ROUND:
        raise ValueError(f"commitment.round: {c.round} (0 to {MAX_ROUND})")
    if len(c.digest) != DIGEST_BYTES:
        raise ValueError(f"commitment.digest: {len(c.digest)} bytes (a sha256 is {DIGEST_BYTES})")
    if not 0 <= c.size <= MAX_CONTRIBUTION_BYTES:
        raise ValueError(f"commitment.size: {c.size} (0 to {MAX_CONTRIBUTION_BYTES})")
    return (MAGIC + struct.pack(">H", len(run_id)) + run_id + struct.pack(">Q", c.round)
            + struct.pack(">H", len(peer_id)) + peer_id + c.digest + struct.pack(">Q", c.size))


def encode_commitment(c: Commitment) -> bytes:
    """The wire form of a signed commitment; ValueError naming the field when a value is out of bounds."""
    if not c.signature or len(c.signature) > MAX_SIGNATURE_BYTES:
        raise ValueError(f"commitment.signature: {len(c.signature)} bytes (1 to {MAX_SIGNATURE_BYTES})")
    return _body(c) + struct.pack(">H", len(c.signature)) + c.signature


def commit(key: RSAPrivateKey, *, run_id: str, round: int, peer_id: str, contribution: bytes) -> Commitment:
    """This peer's signed commitment to ``contribution`` (the exact bytes it will reveal) in ``round`` of ``run_id``.
    ValueError naming the field when an argument is out of bounds."""
    unsigned = Commitment(run_id, round, peer_id, hashlib.sha256(contribution).digest(), len(contribution))
    return Commitment(run_id, round, peer_id, unsigned.digest, unsigned.size, key.sign(DOMAIN + _body(unsigned)))


# ---- checking (hostile input) ----------------------------------------------------------------------------------------
def _take(data: bytes, pos: int, n: int, field: str) -> tuple[bytes, int]:
    if pos + n > len(data):
        raise _Malformed(f"commitment.{field}: truncated ({len(data) - pos} of {n} bytes)")
    return data[pos:pos + n], pos + n


def _take_text(data: bytes, pos: int, limit: int, field: str) -> tuple[str, int]:
    raw, pos = _take(data, pos, 2, field)
    (n,) = struct.unpack(">H", raw)
    if not 1 <= n <= limit:
        raise _Malformed(f"commitment.{field}: {n} bytes (1 to {limit})")
    raw, pos = _take(data, pos, n, field)
    try:
        return raw.decode(), pos
    except UnicodeDecodeError:
        raise _Malformed(f"commitment.{field}: not utf-8") from None


def decode_commitment(data: bytes) -> Checked:
    """The commitment in ``data`` with its fields bounded (its signature not yet checked), or why it is none."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return Checked(False, f"commitment: expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_COMMITMENT_BYTES:
        return Checked(False, f"commitment: {len(data)} bytes (at most {MAX_COMMITMENT_BYTES})")
    try:
        magic, pos = _take(data, 0, len(MAGIC), "magic")
        if magic != MAGIC:
            raise _Malformed("commitment.magic: not a cotrain commitment")
        run_id, pos = _take_text(data, pos, MAX_RUN_ID_BYTES, "run_id")
        raw, pos = _take(data, pos, 8, "round")
        (round_,) = struct.unpack(">Q", raw)
        if round_ > MAX_ROUND:
            raise _Malformed(f"commitment.round: {round_} (at most {MAX_ROUND})")
        peer_id, pos = _take_text(data, pos, MAX_PEER_ID_BYTES, "peer_id")
        digest, pos = _take(data, pos, DIGEST_BYTES, "digest")
        raw, pos = _take(data, pos, 8, "size")
        (size,) = struct.unpack(">Q", raw)
        if size > MAX_CONTRIBUTION_BYTES:
            raise _Malformed(f"commitment.size: {size} (at most {MAX_CONTRIBUTION_BYTES})")
        raw, pos = _take(data, pos, 2, "signature")
        (n,) = struct.unpack(">H", raw)
        if not 1 <= n <= MAX_SIGNATURE_BYTES:
            raise _Malformed(f"commitment.signature: {n} bytes (1 to {MAX_SIGNATURE_BYTES})")
        signature, pos = _take(data, pos, n, "signature")
    except _Malformed as e:
        return Checked(False, str(e))
    if pos != len(data):
        return Checked(False, f"commitment: {len(data) - pos} trailing bytes")
    commitment = Commitment(run_id, round_, peer_id, digest, size, signature)
    return Checked(True, f"commitment of peer ...{peer_id[-8:]} to round {round_}", commitment)


def _public_key(data: bytes) -> RSAPublicKey | str:
    """The RSA public key in ``data`` (OpenSSH encoding), or why it is none."""
    if not isinstance(data, (bytes, bytearray)) or not 1 <= len(data) <= MAX_PUBLIC_KEY_BYTES:
        return f"public_key: expected 1 to {MAX_PUBLIC_KEY_BYTES} bytes"
    try:
        return RSAPublicKey.from_bytes(bytes(data))
    except Exception as e:  # the cryptography library raises several types for garbage keys
        return f"public_key: not an RSA public key in OpenSSH encoding ({type(e).__name__})"


def verify_commitment(data: bytes, public_key: bytes, *, run_id: str, round: int, peer_id: str) -> Checked:
    """Whether ``data`` is a commitment of ``peer_id`` to ``round`` of ``run_id``, signed by ``public_key`` (the record
    key its credential names, OpenSSH encoding); the commitment comes with the answer when it is."""
    decoded = decode_commitment(data)
    if not decoded.ok:
        return decoded
    c = decoded.commitment
    if c.run_id != run_id:
        return Checked(False, f"commitment.run_id: {c.run_id!r}, expected {run_id!r}")
    if c.round != round:
        return Checked(False, f"commitment.round: {c.round}, expected {round}")
    if c.peer_id != peer_id:
        return Checked(False, f"commitment.peer_id: ...{c.peer_id[-8:]}, expected ...{peer_id[-8:]}")
    key = _public_key(public_key)
    if isinstance(key, str):
        return Checked(False, key)
    if not key.verify(DOMAIN + _body(c), c.signature):
        return Checked(False, f"commitment.signature: not made by the record key of peer ...{peer_id[-8:]}")
    return Checked(True, f"commitment of peer ...{peer_id[-8:]} to round {round}, signed", c)


def matches(commitment: Commitment, revealed: bytes) -> Checked:
    """Whether ``revealed`` are the very bytes ``commitment`` was made to."""
    if not isinstance(revealed, (bytes, bytearray, memoryview)):
        return Checked(False, f"revealed: expected bytes, got {type(revealed).__name__}")
    if len(revealed) != commitment.size:
        return Checked(False, f"revealed: {len(revealed)} bytes, the commitment is to {commitment.size}", commitment)
    if not hmac.compare_digest(hashlib.sha256(revealed).digest(), commitment.digest):
        return Checked(False, "revealed: sha256 differs from the commitment's digest", commitment)
    return Checked(True, f"revealed bytes match the commitment of peer ...{commitment.peer_id[-8:]}", commitment)


def find_copies(commitments: Iterable[Commitment]) -> tuple[Copy, ...]:
    """Commitments (already verified) to bytes another commitment of the same run holds, each attributed.

    Within a digest's commitments, the earliest round's is the original when it is alone in that round: every later
    one is a stale or copied update of it. Several peers committing to the same bytes in the same round each get a
    :class:`Copy` naming another of them (the bytes were shared before the reveal, or all are zeros, or the same
    constant). The same commitment seen twice is no copy."""
    groups: dict[tuple[str, bytes], set[tuple[int, str]]] = {}
    for c in commitments:
        groups.setdefault((c.run_id, c.digest), set()).add((c.round, c.peer_id))
    copies = []
    for authors in groups.values():
        if len(authors) < 2:
            continue
        ordered = sorted(authors)
        first_round = ordered[0][0]
        earliest = [peer for round_, peer in ordered if round_ == first_round]
        for round_, peer in ordered:
            if round_ == first_round:
                if len(earliest) > 1:
                    other = next(p for p in earliest if p != peer)
                    copies.append(Copy(peer, round_, other, round_,
                                       f"peer ...{peer[-8:]} committed to the same bytes as peer ...{other[-8:]} "
                                       f"in round {round_}"))
            else:
                origin = peer if peer in earliest else earliest[0]
                what = "resent its own update" if peer == origin else f"copied peer ...{origin[-8:]}'s update"
                copies.append(Copy(peer, round_, origin, first_round,
                                   f"peer ...{peer[-8:]} {what} of round {first_round} in round {round_}"))
    return tuple(copies)
