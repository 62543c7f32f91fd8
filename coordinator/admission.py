"""The coordinator's side of data-plane admission: its signing key, the credentials it issues, the revocations.

The key lives in the state dir (``coordinator.ed25519``, raw 32 bytes, owner-only, written atomically), so a
restarted coordinator keeps vouching with the same key and the credentials it issued before stay valid. Which
credentials to renew and which nodes to revoke are pure decisions (:func:`needs_renewal`, :func:`nodes_to_revoke`)
over the store's view.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable, Iterable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cotrain.averaging.admission import (issue_credential, new_private_key, private_key_bytes, private_key_from_bytes,
                                         public_key_bytes, sign_revocations)
from cotrain.checkpoint import atomic_write_bytes

logger = logging.getLogger(__name__)

KEY_FILE = "coordinator.ed25519"


def load_or_create_key(state_dir: Path) -> Ed25519PrivateKey:
    path = Path(state_dir) / KEY_FILE
    if path.exists():
        return private_key_from_bytes(path.read_bytes())
    key = new_private_key()
    atomic_write_bytes(path, private_key_bytes(key))  # mkstemp: readable by the owner only
    return key


def needs_renewal(issued: float, now: float, ttl: float) -> bool:
    """Renew once half a credential's life has passed: a node then has the other half to reach us again."""
    return now - issued >= ttl / 2


def nodes_to_revoke(revoked_tokens: set[str], members: Iterable[tuple[str, str]]) -> set[str]:
    """Node ids (of (node_id, token_name) pairs) whose token was revoked."""
    return {node_id for node_id, token in members if token in revoked_tokens}


class Issuer:
    """Issues credentials for one run and keeps its revocation list (persisted through ``get_meta``/``set_meta``)."""

    def __init__(self, key: Ed25519PrivateKey, run_id: str, ttl: float, get_meta: Callable, set_meta: Callable,
                 clock: Callable[[], float]):
        self.key, self.run_id, self.ttl, self.clock, self._set_meta = key, run_id, ttl, clock, set_meta
        self.public_key = public_key_bytes(key)
        self.version = int(get_meta("revocations_version") or 0)
        self.revoked: set[str] = set(json.loads(get_meta("revoked_nodes") or "[]"))
        self.signed_revocations = self._sign()

    def _sign(self) -> bytes:
        return sign_revocations(self.key, run_id=self.run_id, version=self.version, node_ids=self.revoked,
                                now=self.clock())

    def issue(self, node_id: str, peer_id: str, record_key: bytes, role: str = "node",
              reputation: float = 1.0) -> bytes:
        return issue_credential(self.key, run_id=self.run_id, node_id=node_id, peer_id=peer_id,
                                record_public_key=record_key, role=role, now=self.clock(), ttl=self.ttl,
                                reputation=reputation)

    def revoke(self, node_ids: set[str]) -> bool:
        """Add ``node_ids`` to the list; True (and a new signed version) when any is new."""
        new = set(node_ids) - self.revoked
        if not new:
            return False
        self.revoked |= new
        self.version += 1
        self._set_meta("revoked_nodes", json.dumps(sorted(self.revoked)))
        self._set_meta("revocations_version", str(self.version))
        self.signed_revocations = self._sign()
        logger.warning("revoked the data-plane credentials of node(s) %s (revocation list v%d)",
                       ", ".join(sorted(n[:8] for n in new)), self.version)
        return True

