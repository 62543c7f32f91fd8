"""Per-address rate limits on Join and Heartbeat: a token bucket (:class:`cotrain.ratelimit.TokenBucket`) per
(method, address).

A caller over its rate gets RESOURCE_EXHAUSTED (nodes back off and retry). Addresses are the peer's IP without
its port, so one machine cannot dodge the limit by opening new connections. Old buckets are forgotten.
"""

from __future__ import annotations

import time
from typing import Callable

from cotrain.ratelimit import TokenBucket


def peer_address(peer: str) -> str:
    """gRPC's ``context.peer()`` ('ipv4:1.2.3.4:5678', 'ipv6:[::1]:5678') -> the address without the port."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host, _, _ = rest.rpartition(":")
        return host.strip("[]") or rest
    return peer


class RateLimiter:
    def __init__(self, rate_per_s: float, burst: float, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 100_000):
        self.rate, self.burst, self.clock, self.max_keys = rate_per_s, burst, clock, max_keys
        self.buckets: dict[str, TokenBucket] = {}

    def allow(self, key: str) -> bool:
        """Take one token for ``key``; False when its bucket is empty. A rate of 0 disables the limit."""
        if self.rate <= 0:
            return True
        now = self.clock()
        bucket = self.buckets.get(key)
        if bucket is None:
            if len(self.buckets) >= self.max_keys:
                self._forget_full(now)
            bucket = self.buckets[key] = TokenBucket(self.rate, self.burst, now)
        return bucket.try_take(now)

    def _forget_full(self, now: float) -> None:
        """Drop buckets that have refilled (they hold no information); the oldest if none has."""
        full = [k for k, b in self.buckets.items() if b.level(now) >= b.capacity]
        for k in full or sorted(self.buckets, key=lambda k: self.buckets[k].updated)[: len(self.buckets) // 2]:
            del self.buckets[k]
