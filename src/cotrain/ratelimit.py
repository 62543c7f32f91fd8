"""The token bucket behind every rate limit of cotrain: the coordinator's per-address limits on Join and Heartbeat
(:class:`cotrain.coordinator.ratelimit.RateLimiter`) and a node's upload limit
(:class:`UploadLimiter`).

A bucket holds at most ``capacity`` tokens, starts full and gains ``rate`` tokens per second. The caller passes the
time, so one clock serves many buckets and tests drive them with plain numbers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable


class TokenBucket:
    __slots__ = ("rate", "capacity", "tokens", "updated")

    def __init__(self, rate: float, capacity: float, now: float):
        self.rate, self.capacity = rate, capacity
        self.tokens, self.updated = capacity, now

    def level(self, now: float) -> float:
        """The tokens the bucket holds at ``now`` (negative while a debt is being paid off)."""
        return min(self.capacity, self.tokens + (now - self.updated) * self.rate)

    def _refill(self, now: float) -> None:
        self.tokens, self.updated = self.level(now), now

    def try_take(self, now: float, n: float = 1.0) -> bool:
        """Take ``n`` tokens if the bucket holds them; False (and nothing taken) if not."""
        self._refill(now)
        if self.tokens < n:
            return False
        self.tokens -= n
        return True

    def take(self, now: float, n: float) -> float:
        """Take ``n`` tokens whether or not the bucket holds them (it goes into debt); the seconds to wait before
        acting on them, 0 when they were there."""
        self._refill(now)
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class UploadLimiter:
    """``await limiter.take(n)`` returns once n more bytes may go out at ``rate_bps`` bits/s: a token bucket of
    bytes that holds at most ``burst_s`` seconds of them, so an idle spell cannot be spent as a long burst.
    """

    def __init__(self, rate_bps: float, burst_s: float = 0.1, clock: Callable[[], float] = time.monotonic):
        if rate_bps <= 0:
            raise ValueError(f"--max-upload-mbps: must be > 0, got {rate_bps / 1e6}")
        rate = rate_bps / 8.0  # bytes per second
        self.clock = clock
        self.bucket = TokenBucket(rate, max(1.0, rate * burst_s), clock())

    def delay_for(self, nbytes: int) -> float:
        """Seconds to wait before sending ``nbytes`` (and take them from the bucket)."""
        return self.bucket.take(self.clock(), nbytes)

    async def take(self, nbytes: int) -> None:
        delay = self.delay_for(nbytes)
        if delay > 0:
            await asyncio.sleep(delay)
