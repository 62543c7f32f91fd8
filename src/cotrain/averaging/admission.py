"""Who may touch the model: data-plane credentials, checked on every interaction between peers.

The coordinator admits nodes by token over gRPC; the data plane (DHT, all-reduce, state downloads) is peer to peer,
so admission must travel with the peers. After a node's DHT peer starts, the coordinator issues it a short-lived
**credential**: a :class:`~cotrain.v1.swarm_pb2.Credential` (run id, node id, the node's libp2p peer id, the public
key that signs its progress records, role, expiry) signed with the coordinator's Ed25519 key, whose public half
every node got in its JoinResponse. A peer then

- serves an all-reduce piece or the shared state only to a requester whose credential is valid for this run and
  names the libp2p peer id the connection is authenticated as (libp2p's handshake proves the peer id, so a
  credential copied off the wire is useless to anyone else);
- averages only with groupmates whose credentials check out (each presents it when the group forms);
- reads only progress records whose credential names both the publishing peer and the key the record is signed
  with.

A credential lasts ``coordinator.credential_ttl_s``; nodes renew it on heartbeats once half of it has passed, so a
coordinator outage shorter than that goes unnoticed. Revoking a token makes the coordinator stop renewing its nodes'
credentials and publish a signed :class:`~cotrain.v1.swarm_pb2.Revocations` list (in heartbeat answers and on the
DHT) that peers apply at once.

Everything here is pure but for :class:`Admission`, which holds one peer's view (its own credential, the newest
revocation list, a cache of verified credentials, and counts of what it refused) and takes a clock, so tests drive
it with plain numbers.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.message import DecodeError
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import RecordValidatorBase

from cotrain.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)

CREDENTIAL_DOMAIN = b"cotrain-credential-v1"
REVOCATIONS_DOMAIN = b"cotrain-revocations-v1"
#: a credential (with an RSA-2048 record key) is about 500 bytes; anything much larger is not one
MAX_CREDENTIAL_BYTES = 4096
MAX_REVOCATIONS_BYTES = 1 << 20
#: clocks of volunteers' machines disagree; a credential "issued" this far in the future is still accepted
CLOCK_SKEW_S = 60.0
ROLES = ("node", "coordinator")


class AdmissionError(ValueError):
    """Bytes that are not a valid signed message of the coordinator."""


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    node_id: str = ""
    expires: float = 0.0


# ---- keys ------------------------------------------------------------------------------------------------------------
def new_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def private_key_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def private_key_from_bytes(data: bytes) -> Ed25519PrivateKey:
    if len(data) != 32:
        raise AdmissionError(f"an Ed25519 private key is 32 bytes, got {len(data)}")
    return Ed25519PrivateKey.from_private_bytes(data)


def public_key_bytes(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_from_bytes(data: bytes) -> Ed25519PublicKey:
    if len(data) != 32:
        raise AdmissionError(f"coordinator_public_key: an Ed25519 public key is 32 bytes, got {len(data)}")
    return Ed25519PublicKey.from_public_bytes(data)


# ---- signing (the coordinator) ---------------------------------------------------------------------------------------
def issue_credential(key: Ed25519PrivateKey, *, run_id: str, node_id: str, peer_id: str, record_public_key: bytes,
                     role: str, now: float, ttl: float, reputation: float = 1.0) -> bytes:
    """A serialized :class:`SignedCredential` valid from ``now`` for ``ttl`` seconds; ``reputation``: the weight
    verification gives the member, in (0, 1]."""
    if role not in ROLES:
        raise ValueError(f"role: expected one of {ROLES}, got {role!r}")
    if not 0.0 < reputation <= 1.0:
        raise ValueError(f"reputation: expected a number in (0, 1], got {reputation}")
    body = pb.Credential(run_id=run_id, node_id=node_id, peer_id=peer_id, record_public_key=record_public_key,
                         role=role, issued_unix=now, expires_unix=now + ttl,
                         reputation=reputation).SerializeToString()
    return pb.SignedCredential(body=body, signature=key.sign(CREDENTIAL_DOMAIN + body)).SerializeToString()


def sign_revocations(key: Ed25519PrivateKey, *, run_id: str, version: int, node_ids: Iterable[str],
                     now: float) -> bytes:
    body = pb.Revocations(run_id=run_id, version=version, issued_unix=now,
                          node_ids=sorted(set(node_ids))).SerializeToString()
    return pb.SignedRevocations(body=body, signature=key.sign(REVOCATIONS_DOMAIN + body)).SerializeToString()


# ---- checking (every peer) -------------------------------------------------------------------------------------------
def _open(data: bytes, limit: int, signed_type, domain: bytes, public_key: Ed25519PublicKey, what: str) -> bytes:
    if not data:
        raise AdmissionError(f"no {what}")
    if len(data) > limit:
        raise AdmissionError(f"{what} of {len(data)} bytes (at most {limit})")
    try:
        signed = signed_type.FromString(data)
    except DecodeError:
        raise AdmissionError(f"{what} is not a valid {signed_type.DESCRIPTOR.full_name}") from None
    try:
        public_key.verify(signed.signature, domain + signed.body)
    except InvalidSignature:
        raise AdmissionError(f"{what} is not signed by this run's coordinator") from None
    return signed.body


def parse_credential(data: bytes, public_key: Ed25519PublicKey) -> pb.Credential:
    """The credential inside ``data`` once its signature checks out; AdmissionError otherwise. Do not change the
    message it returns: the same bytes give the same one (see :func:`_verified_credential`)."""
    if not data or len(data) > MAX_CREDENTIAL_BYTES:  # before the cache: nothing hostile is kept
        _open(data, MAX_CREDENTIAL_BYTES, pb.SignedCredential, CREDENTIAL_DOMAIN, public_key, "credential")
    return _verified_credential(bytes(data), public_key_bytes(public_key))


@functools.lru_cache(maxsize=4096)
def _verified_credential(data: bytes, public_key: bytes) -> pb.Credential:
    """A credential's signature, checked once per (bytes, key): every read of the progress board carries every
    member's credential, and every DHT peer answering a read returns them all, so with 16 nodes on 2 cores checking
    them again and again was most of what the DHT processes did (bench/scale.py). Only credentials that check out
    are kept (an exception is not cached); whether one still admits (expiry, revocations) is decided at every use."""
    body = _open(data, MAX_CREDENTIAL_BYTES, pb.SignedCredential, CREDENTIAL_DOMAIN, public_key_from_bytes(public_key),
                 "credential")
    try:
        return pb.Credential.FromString(body)
    except DecodeError:
        raise AdmissionError("credential body is not a valid cotrain.v1.Credential") from None


def parse_revocations(data: bytes, public_key: Ed25519PublicKey, run_id: str) -> pb.Revocations:
    body = _open(data, MAX_REVOCATIONS_BYTES, pb.SignedRevocations, REVOCATIONS_DOMAIN, public_key,
                 "revocation list")
    try:
        revocations = pb.Revocations.FromString(body)
    except DecodeError:
        raise AdmissionError("revocation list body is not a valid cotrain.v1.Revocations") from None
    if revocations.run_id != run_id:
        raise AdmissionError(f"revocation list of run {revocations.run_id!r}, not {run_id!r}")
    return revocations


def credential_decision(cred: pb.Credential, *, run_id: str, peer_id: str, now: float, revoked: frozenset,
                        record_public_key: Optional[bytes] = None) -> Verdict:
    """Whether a credential (its signature already checked) admits ``peer_id`` now, and why not."""
    who = cred.node_id[:8] or "?"
    if cred.run_id != run_id:
        return Verdict(False, f"credential of run {cred.run_id!r}, not {run_id!r}", cred.node_id)
    if cred.peer_id != peer_id:
        return Verdict(False, f"credential of peer ...{cred.peer_id[-8:]} presented by ...{peer_id[-8:]}",
                       cred.node_id)
    if cred.role not in ROLES:
        return Verdict(False, f"credential with unknown role {cred.role!r}", cred.node_id)
    if cred.issued_unix > now + CLOCK_SKEW_S:
        return Verdict(False, f"credential of node {who} issued {cred.issued_unix - now:.0f}s in the future",
                       cred.node_id)
    if now >= cred.expires_unix:
        return Verdict(False, f"credential of node {who} expired {now - cred.expires_unix:.0f}s ago", cred.node_id)
    if cred.node_id in revoked:
        return Verdict(False, f"node {who} was revoked", cred.node_id)
    if record_public_key is not None and cred.record_public_key != record_public_key:
        return Verdict(False, f"credential of node {who} names another record key", cred.node_id)
    return Verdict(True, f"member node {who}", cred.node_id, cred.expires_unix)


class Admission:
    """One peer's gate to the data plane.

    ``public_key``: the coordinator's (None with ``enabled=False``: every check passes; benches measure the cost of
    the checks this way). ``credential``: this peer's own, presented with every request (:meth:`set_credential`
    replaces it when renewed).
    """

    #: verified credentials kept (by their hash) so that a signature is checked once, not on every fetch
    CACHE_SIZE = 4096

    def __init__(self, run_id: str, public_key: Optional[Ed25519PublicKey], credential: bytes = b"",
                 enabled: bool = True, clock: Callable[[], float] = time.time):
        if enabled and public_key is None:
            raise ValueError("Admission: a coordinator public key is needed when checks are enabled")
        self.run_id, self.public_key, self.enabled, self.clock = run_id, public_key, enabled, clock
        self._credential = credential
        self._lock = threading.Lock()
        self._cache: dict[bytes, pb.Credential] = {}
        #: peer id -> (issued_unix, reputation) of the newest valid credential it presented
        self._reputations: dict[str, tuple[float, float, bytes]] = {}  # peer -> (issued, reputation, record key)
        self.revoked: frozenset = frozenset()
        self.revocations_version = -1
        self.refused = 0
        #: peer id -> why it was last refused (what the node reports to the coordinator's alerts)
        self.refused_peers: dict[str, str] = {}
        self._last_refusal_log = 0.0
        self._suppressed = 0

    # ---- own credential ------------------------------------------------------------------------------------------
    def credential(self) -> bytes:
        return self._credential

    def set_credential(self, data: bytes) -> None:
        if data:
            self._credential = data

    # ---- revocations ---------------------------------------------------------------------------------------------
    def apply_revocations(self, data: bytes) -> bool:
        """Take a signed revocation list if it is valid and newer than ours; True when it changed anything."""
        if not data or self.public_key is None:
            return False
        try:
            revocations = parse_revocations(data, self.public_key, self.run_id)
        except AdmissionError as e:
            logger.warning("ignored a revocation list: %s", e)
            return False
        with self._lock:
            if revocations.version <= self.revocations_version:
                return False
            self.revocations_version = revocations.version
            added = set(revocations.node_ids) - self.revoked
            self.revoked = frozenset(revocations.node_ids)
        if added:
            logger.warning("revocation list v%d: node(s) %s revoked; refusing them from now on",
                           revocations.version, ", ".join(sorted(n[:8] for n in added)))
        return True

    # ---- checks --------------------------------------------------------------------------------------------------
    def verify(self, credential: bytes, peer_id: str, record_public_key: Optional[bytes] = None) -> Verdict:
        """Whether ``peer_id`` (as authenticated by libp2p, or as named in a record signed by
        ``record_public_key``) presents a valid credential. Does not count refusals: see :meth:`check`."""
        if not self.enabled:
            return Verdict(True, "data-plane checks are off")
        digest = hashlib.sha256(credential).digest()
        cred = self._cache.get(digest)
        if cred is None:
            try:
                cred = parse_credential(credential, self.public_key)
            except AdmissionError as e:
                return Verdict(False, str(e))
            with self._lock:
                if len(self._cache) >= self.CACHE_SIZE:
                    self._cache.clear()
                self._cache[digest] = cred
        verdict = credential_decision(cred, run_id=self.run_id, peer_id=peer_id, now=self.clock(),
                                      revoked=self.revoked, record_public_key=record_public_key)
        if verdict.ok:
            self._note_reputation(peer_id, cred)
        return verdict

    def _note_reputation(self, peer_id: str, cred: pb.Credential) -> None:
        value = cred.reputation if 0.0 < cred.reputation <= 1.0 else 1.0
        with self._lock:
            known = self._reputations.get(peer_id)
            if known is None or cred.issued_unix >= known[0]:  # an older credential does not undo a newer one
                if known is None and len(self._reputations) >= self.CACHE_SIZE:
                    self._reputations.clear()
                self._reputations[peer_id] = (cred.issued_unix, value, bytes(cred.record_public_key))

    def reputation(self, peer_id: str) -> float:
        """The weight verification gives ``peer_id``, from the newest credential it presented (1: none seen, or
        never checked)."""
        with self._lock:
            known = self._reputations.get(peer_id)
        return 1.0 if known is None else known[1]

    def record_key(self, peer_id: str) -> Optional[bytes]:
        """The record key the newest credential ``peer_id`` presented names (None: none checked, e.g. with the
        data-plane checks off): what its signed parts are checked with (verification)."""
        with self._lock:
            known = self._reputations.get(peer_id)
        return known[2] if known is not None and known[2] else None

    def check(self, credential: bytes, peer_id: str, what: str,
              record_public_key: Optional[bytes] = None) -> Verdict:
        """:meth:`verify`, counting and logging (rate-limited) a refusal of ``what`` (e.g. "a state download")."""
        verdict = self.verify(credential, peer_id, record_public_key)
        if not verdict.ok:
            self.refuse(peer_id, f"{what}: {verdict.reason}")
        return verdict

    def refuse(self, peer_id: str, reason: str) -> None:
        with self._lock:
            self.refused += 1
            if peer_id not in self.refused_peers and len(self.refused_peers) >= 256:
                self.refused_peers.pop(next(iter(self.refused_peers)))
            self.refused_peers[peer_id] = reason
            now = time.monotonic()
            if now - self._last_refusal_log < 5.0:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last_refusal_log = self._suppressed, 0, now
        logger.warning("refused peer ...%s: %s%s", peer_id[-8:], reason,
                       f" ({suppressed} more refusals in the last seconds)" if suppressed else "")


OWNER_MARKER = b"[owner:"


def split_owner_subkey(subkey: bytes) -> Optional[tuple[str, bytes]]:
    """A progress record's subkey ``peer_id + b"[owner:" + record_public_key + b"]"`` -> (peer id, record key)."""
    if not isinstance(subkey, bytes) or OWNER_MARKER not in subkey or not subkey.endswith(b"]"):
        return None
    at = subkey.index(OWNER_MARKER)
    return subkey[:at].decode(errors="replace"), subkey[at + len(OWNER_MARKER):-1]


class MembershipValidator(RecordValidatorBase):
    """A DHT record validator: a peer stores (and returns) a progress record of ``run_id`` only when the record
    carries a credential that names the peer in its subkey and the key it is signed with.

    It runs inside the DHT's own process (hivemind copies validators there), so it holds the revocations as of
    when it was added; adding a newer one (:meth:`merge_with`) updates them. Signatures are checked by hivemind's
    RSA validator first (higher priority), so this one sees the value without its signature.
    """

    def __init__(self, run_id: str, key_names: str | Sequence[str], public_key: bytes, revoked: Iterable[str] = (),
                 version: int = -1):
        """``key_names``: the progress board's key, or its shards' keys."""
        self.run_id, self.public_key, self.revoked, self.version = run_id, public_key, frozenset(revoked), version
        names = [key_names] if isinstance(key_names, str) else list(key_names)
        self.key_ids = frozenset(DHTID.generate(source=name).to_bytes() for name in names)

    def validate(self, record) -> bool:
        if record.key not in self.key_ids:
            return True
        try:
            subkey = DHTProtocol.serializer.loads(record.subkey)
            value = DHTProtocol.serializer.loads(record.value)
        except (ValueError, TypeError):  # msgpack's errors of malformed bytes: the record is simply invalid
            return False
        if value is None:
            return True
        owner = split_owner_subkey(subkey)
        if owner is None or not isinstance(value, dict) or not isinstance(value.get("cred"), bytes):
            return False
        try:
            cred = parse_credential(value["cred"], public_key_from_bytes(self.public_key))
        except AdmissionError:
            return False
        return credential_decision(cred, run_id=self.run_id, peer_id=owner[0], now=time.time(), revoked=self.revoked,
                                   record_public_key=owner[1]).ok

    @property
    def priority(self) -> int:
        return 5  # below the RSA signature validator (10): validated after it, on the value it stripped

    def merge_with(self, other) -> bool:
        if not isinstance(other, MembershipValidator) or other.key_ids != self.key_ids:
            return False
        if other.version > self.version:
            self.revoked, self.version = other.revoked, other.version
        return True
