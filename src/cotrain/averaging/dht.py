"""Starting a hivemind DHT peer without its process-wide side effects."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import signal
import struct
import sys
import time
from collections import OrderedDict
from typing import Iterator, Sequence

from hivemind.dht import DHT

from cotrain import hivemind_private  # noqa: F401 - importing it mends hivemind's handler-task leak
from hivemind.dht.validation import CompositeValidator, DHTRecord, RecordValidatorBase
from hivemind.utils.crypto import RSAPrivateKey


#: hivemind's DHT caches what it gets and stores, and keeps the cache fresh by itself: a get stores the value it found
#: on a nearby peer that lacked it, a store to a key in the cache fetches the key again at once, and a cached key is
#: fetched again before it expires. Every read cotrain makes asks for the latest value (the progress board, the
#: revocation list, hivemind's matchmaking), which no cache answers, so caching only multiplies the DHT's traffic:
#: 32 nodes on one machine spent 0.6-0.75 of its 2 cores in their DHT processes (bench/scale.py)
NO_CACHE = dict(cache_locally=False, cache_nearest=0, cache_refresh_before_expiry=0, cache_on_store=False)

#: How many DHT peers keep each stored value (hivemind's ``num_replicas``, 5 by default). Everything cotrain stores
#: is soft state that its owner stores again within seconds (a progress record every ``progress_interval``, the
#: revocation list, matchmaking's declarations), so a replica lost to churn costs at most one interval; each replica
#: checks every record it is sent (signature, schema, credential), and at 32 nodes on a sixteenth of a core each the
#: DHT processes and libp2p daemons took more CPU than the training (bench/scale.py). Raise it for swarms with heavy
#: churn, where all of a key's replicas may go within one interval.
REPLICAS = 3
#: the libp2p daemon's Go garbage collector target (GOGC), given to the daemons this process starts: a heap may grow
#: to 1 + GOGC/100 times what it holds live before Go collects it, so the daemon's memory settles at about that
#: multiple of its working set. bench/daemon_memory.py (docs/results/daemon_memory.md) measures both side by side;
#: the daemon's collections cost little CPU beside a node's training. A GOGC in the environment is an operator's
#: choice and is kept
DAEMON_GOGC = "50"

#: How many of a key's nearest DHT peers a read or a store keeps in its search (hivemind's ``beam_size``; pass it to
#: ``DHT.get`` and ``DHT.store``). hivemind's default is the bucket size, 20: a read of the latest value visits the 20
#: peers nearest the key, and a store searches as many before it stores to the nearest ``REPLICAS``. With a few peers
#: that is all of them; at 32 nodes it was most of the swarm for every read and every store. Kept at twice
#: ``REPLICAS`` so that a read still reaches every replica a store chose when the two searches' routing tables differ
#: a little; raise it towards 20 if reads come back missing records that were stored (churn, peers whose routing
#: tables lag).
SEARCH_BEAM = 2 * REPLICAS


@contextlib.contextmanager
def go_gc_target() -> Iterator[None]:
    """:data:`DAEMON_GOGC` in the environment inside the block (unless GOGC is set already), as it was after."""
    if "GOGC" in os.environ:
        yield
        return
    os.environ["GOGC"] = DAEMON_GOGC
    try:
        yield
    finally:
        os.environ.pop("GOGC", None)


def start_dht(initial_peers: Sequence[str] = (), host: str = "127.0.0.1", port: int = 0,
              client_mode: bool = False, identity_path: str | None = None, announce: Sequence[str] = ()) -> DHT:
    """Start a DHT peer listening on ``host:port`` (port 0: any free port) and joined to ``initial_peers``.

    ``client_mode``: the peer makes outgoing connections only (a volunteer behind NAT); hivemind's optimizer and
    averagers take it from here, not from their own arguments. ``identity_path``: a file holding this peer's
    private key, so that a restarted node keeps its peer id (created when missing). Peers started in one process
    need distinct identities, otherwise they share one key. ``announce``: multiaddrs to tell peers instead of the
    listening ones (a public address behind port forwarding or a cloud load balancer).
    """
    die_with_parent()
    share_tensors_by_descriptor()
    handler = signal.getsignal(signal.SIGINT)
    kwargs = {}
    if identity_path is not None:
        kwargs["identity_path"] = identity_path
    if announce:
        kwargs["announce_maddrs"] = list(announce)
    with go_gc_target():  # the DHT's process starts the daemon with this process's environment
        dht = DHT(
            initial_peers=list(initial_peers),
            host_maddrs=[f"/ip4/{host}/tcp/{port}"],
            client_mode=client_mode,
            start=True,
            num_replicas=REPLICAS,
            **NO_CACHE,
            **kwargs,
        )
    signal.signal(signal.SIGINT, handler)
    dht.run_coroutine(remember_verdicts)
    return dht


def share_tensors_by_descriptor() -> None:
    """Undo hivemind's choice of torch's "file_system" sharing strategy (made when it is imported): with it, the first
    tensor hivemind shares with its DHT or averager process starts a ``torch_shm_manager`` daemon, 110 MB resident
    (66 MB proportional) of a node's memory. Those processes are forked, so they share tensors by inherited file
    descriptors just as well. An operator's ``HIVEMIND_MEMORY_SHARING_STRATEGY`` is left as it is."""
    if "HIVEMIND_MEMORY_SHARING_STRATEGY" not in os.environ:
        import torch.multiprocessing

        torch.multiprocessing.set_sharing_strategy("file_descriptor")


_DIE_WITH_PARENT = False


def die_with_parent() -> None:
    """Make every process this one forks from now on (hivemind's DHT and averager processes, and the libp2p daemons
    they start) die when its parent dies, even by kill -9. Otherwise a crashed node leaves its DHT peer running
    under its identity, and the node cannot come back with the same identity. Linux only; elsewhere a no-op."""
    global _DIE_WITH_PARENT
    if _DIE_WITH_PARENT or not sys.platform.startswith("linux"):
        return
    os.register_at_fork(after_in_child=kill_me_with_parent)
    _DIE_WITH_PARENT = True


def kill_me_with_parent() -> None:
    """In a child process (after fork, or as a subprocess's preexec_fn): receive SIGKILL when the parent dies
    (Linux's PR_SET_PDEATHSIG); elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def visible_maddrs(dht: DHT) -> list[str]:
    return [str(m) for m in dht.get_visible_maddrs()]


def load_record_key(path: str | os.PathLike | None) -> RSAPrivateKey:
    """The RSA key that signs this peer's DHT records (its progress), kept in ``path`` (created when missing, written
    atomically, readable by the owner only) so that a node restarted with the same identity signs with the same
    key and overwrites its own record. None: a new key for this process's lifetime."""
    if path is None:
        return RSAPrivateKey()
    path = os.fspath(path)
    if os.path.exists(path):
        key = RSAPrivateKey.__new__(RSAPrivateKey)
        with open(path, "rb") as f:
            key.__setstate__({"_private_key": f.read()})  # hivemind's own unpickling: DER bytes
        return key
    key = RSAPrivateKey()
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.to_bytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return key


class RememberedVerdicts(RecordValidatorBase):
    """The DHT process's record validators, with the verdict on each record remembered for ``max_age`` seconds.

    hivemind validates every record of a dictionary value each time a peer returns it: every step of a lookup, from
    every replica, and a store's lookup returns the key's whole dictionary too. The progress board's records are
    checked by three validators (the schema, the RSA signature, the credential), so on 32 nodes sharing one machine
    half of their DHT processes' CPU went into checking the same records again (py-spy). A verdict is a function of
    the record's bytes (key, subkey, value, expiration) and of the validators, so it is kept until the validators
    change (:meth:`extend`: new revocations apply at once) or ``max_age`` passes (a credential that expires
    meanwhile is seen expired at most that late; a record is republished with new bytes every progress interval,
    so a few seconds keep nearly every repeat). At most ``size`` verdicts are kept, the oldest forgotten first, each
    under a 16-byte digest of the record rather than its bytes (a board record is ~1.5 KB)."""

    def __init__(self, inner: CompositeValidator, size: int = 2048, max_age: float = 10.0, clock=time.monotonic):
        self.inner, self.size, self.max_age, self.clock = inner, size, max_age, clock
        self._verdicts: OrderedDict = OrderedDict()  # digest of the record -> (verdict, when)

    def validate(self, record: DHTRecord) -> bool:
        now = self.clock()
        key = self.digest(record)
        known = self._verdicts.get(key)
        if known is not None and now - known[1] <= self.max_age:
            return known[0]
        verdict = bool(self.inner.validate(record))
        self._verdicts[key] = (verdict, now)
        self._verdicts.move_to_end(key)
        while len(self._verdicts) > self.size:
            self._verdicts.popitem(last=False)
        return verdict

    @staticmethod
    def digest(record: DHTRecord) -> bytes:
        """A 16-byte digest of everything a verdict depends on: key, subkey, value (each length-prefixed, so that no
        two records run together alike) and expiration."""
        h = hashlib.blake2b(digest_size=16)
        for part in (record.key, record.subkey, record.value):
            part = bytes(part or b"")
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
        h.update(struct.pack("<d", float(record.expiration_time)))
        return h.digest()

    def sign_value(self, record: DHTRecord) -> bytes:
        return self.inner.sign_value(record)

    def strip_value(self, record: DHTRecord) -> bytes:
        return self.inner.strip_value(record)

    def extend(self, validators) -> None:
        self.inner.extend(validators)
        self._verdicts.clear()

    @property
    def priority(self) -> int:
        return self.inner.priority

    def merge_with(self, other) -> bool:
        return False


async def remember_verdicts(_dht: DHT, node) -> None:
    """Run in the DHT process (``dht.run_coroutine``): wrap its validators in :class:`RememberedVerdicts`."""
    if not isinstance(node.protocol.record_validator, RememberedVerdicts):
        node.protocol.record_validator = RememberedVerdicts(node.protocol.record_validator or CompositeValidator())
