"""Volunteers behind NAT on one machine: Linux network namespaces for tests and benches.

    with NatLab(nat=2) as lab:          # needs root and ``ip netns``; see unavailable()
        lab.prefix(lab.public)          # ["ip", "netns", "exec", NAME]: run a command in a namespace
        lab.public_ip, lab.nat_ip(0)

The lab is one "public" namespace and ``nat`` namespaces, each NAT namespace joined to the public one by its own
veth pair (a /30: 10.231.(i+1).1 on the public side, .2 on the NAT side). The public namespace holds the public
address ``public_ip`` (10.231.0.1) on its loopback, so every NAT namespace reaches it over its own link (a default
route via its link's public end) and a coordinator and public nodes listen on one address that all of them dial.
The public namespace does not forward, so a NAT namespace reaches nothing but the public namespace: not another
NAT namespace, not the machine's own network. A process in a NAT namespace that listens only on its loopback (a
node's default ``--dht-host 127.0.0.1``) can dial out but nobody can dial in, as behind a home router; one that
listens on ``nat_ip(i)`` is reachable from the public namespace (a volunteer with a public address).

Names are unique per lab (``ctnat-XXXXXX-pub``, ``-n0``, ...); ``teardown`` deletes exactly the namespaces this lab
created (their veth pairs go with them) and is safe to call twice. Nothing is added to the machine's own namespace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from typing import Optional

BASE = "10.231"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def unavailable() -> Optional[str]:
    """Why namespaces cannot be built here (not root, no ``ip``, ``ip netns add`` refused), or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"ctnat-probe-{uuid.uuid4().hex[:8]}"
    added = sh("ip", "netns", "add", probe, check=False)
    if added.returncode != 0:
        return f"`ip netns add` failed: {added.stderr.strip()}"
    sh("ip", "netns", "delete", probe, check=False)
    return None


class NatLab:
    def __init__(self, nat: int = 1, rate_mbit: float = 0.0):
        self.tag = f"ctnat-{uuid.uuid4().hex[:6]}"
        self.public = f"{self.tag}-pub"
        self.nats = [f"{self.tag}-n{i}" for i in range(nat)]
        self.public_ip = f"{BASE}.0.1"
        self.rate_mbit = rate_mbit  # > 0: a token bucket on both ends of every link (upload and download)
        self._created: list[str] = []

    @staticmethod
    def prefix(namespace: str) -> list[str]:
        return ["ip", "netns", "exec", namespace]

    @staticmethod
    def nat_ip(i: int) -> str:
        """The address of NAT namespace i on its link (reachable from the public namespace only)."""
        return f"{BASE}.{i + 1}.2"

    @staticmethod
    def gateway_ip(i: int) -> str:
        return f"{BASE}.{i + 1}.1"

    def _in(self, namespace: str, *cmd: str) -> None:
        sh(*self.prefix(namespace), *cmd)

    def setup(self) -> "NatLab":
        try:
            self._add(self.public)
            self._in(self.public, "ip", "link", "set", "lo", "up")
            self._in(self.public, "ip", "addr", "add", f"{self.public_ip}/32", "dev", "lo")
            self._in(self.public, "sysctl", "-q", "-w", "net.ipv4.ip_forward=0")
            for i, ns in enumerate(self.nats):
                self._add(ns)
                self._in(ns, "ip", "link", "set", "lo", "up")
                down, up = f"nat{i}", "uplink"  # the public end, the NAT end
                sh("ip", "link", "add", down, "netns", self.public, "type", "veth", "peer", "name", up, "netns", ns)
                self._in(self.public, "ip", "addr", "add", f"{self.gateway_ip(i)}/30", "dev", down)
                self._in(self.public, "ip", "link", "set", down, "up")
                self._in(ns, "ip", "addr", "add", f"{self.nat_ip(i)}/30", "dev", up)
                self._in(ns, "ip", "link", "set", up, "up")
                self._in(ns, "ip", "route", "add", "default", "via", self.gateway_ip(i))
                if self.rate_mbit > 0:
                    for where, dev in ((self.public, down), (ns, up)):
                        self._in(where, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                                 f"{self.rate_mbit:g}mbit", "burst", "32kbit", "latency", "400ms")
        except BaseException:
            self.teardown()
            raise
        return self

    def _add(self, namespace: str) -> None:
        sh("ip", "netns", "add", namespace)
        self._created.append(namespace)

    def teardown(self) -> None:
        while self._created:
            sh("ip", "netns", "delete", self._created.pop(), check=False)

    def __enter__(self) -> "NatLab":
        return self.setup()

    def __exit__(self, *exc) -> None:
        self.teardown()

    # ---- probes ------------------------------------------------------------------------------------------------
    def can_connect(self, namespace: str, host: str, port: int, timeout: float = 3.0) -> bool:
        """Whether a TCP connection from ``namespace`` to host:port is accepted."""
        code = (f"import socket, sys\ntry:\n socket.create_connection(({host!r}, {port}), timeout={timeout}).close()\n"
                f"except OSError:\n sys.exit(1)")
        return subprocess.run([*self.prefix(namespace), sys.executable, "-c", code],
                              capture_output=True).returncode == 0

    def listener(self, namespace: str, host: str) -> "Listener":
        return Listener(self.prefix(namespace), host)


class Listener:
    """A TCP server on host:port (any free port) in a namespace that accepts and closes connections until closed."""

    def __init__(self, prefix: list[str], host: str):
        code = (f"import socket, sys\ns = socket.socket()\ns.bind(({host!r}, 0))\ns.listen(16)\n"
                f"print(s.getsockname()[1], flush=True)\nwhile True:\n s.accept()[0].close()")
        self.proc = subprocess.Popen([*prefix, sys.executable, "-c", code], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.strip():
            self.close()
            raise RuntimeError(f"listener on {host} did not start: {self.proc.stderr.read().strip()}")
        self.port = int(line)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
