"""Starting a hivemind DHT peer without its process-wide side effects."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Sequence

from hivemind.dht import DHT
from hivemind.utils.crypto import RSAPrivateKey


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
    dht = DHT(
        initial_peers=list(initial_peers),
        host_maddrs=[f"/ip4/{host}/tcp/{port}"],
        client_mode=client_mode,
        start=True,
        **kwargs,
    )
    signal.signal(signal.SIGINT, handler)
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
