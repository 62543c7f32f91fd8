"""Rate limits: the one token bucket (cotrain.ratelimit) and the coordinator's per-address limiter built on it."""

import pytest

from cotrain.coordinator.ratelimit import RateLimiter, peer_address
from cotrain.ratelimit import TokenBucket


def test_bucket_starts_full_refills_at_its_rate_and_never_beyond_its_capacity():
    bucket = TokenBucket(rate=2.0, capacity=3.0, now=0.0)
    assert [bucket.try_take(0.0) for _ in range(4)] == [True, True, True, False]  # the capacity, then no more
    assert not bucket.try_take(0.25)  # half a token back: not enough for one
    assert bucket.try_take(0.5) and not bucket.try_take(0.5)  # one token back after half a second at 2/s
    assert bucket.level(100.0) == 3.0
    assert not bucket.try_take(100.0, n=4.0) and bucket.try_take(100.0, n=3.0)  # a refused take takes nothing


def test_bucket_taken_into_debt_says_how_long_to_wait():
    bucket = TokenBucket(rate=1000.0, capacity=100.0, now=0.0)
    assert bucket.take(0.0, 100) == 0.0
    assert bucket.take(0.0, 500) == pytest.approx(0.5)  # 500 tokens owed at 1000/s
    assert bucket.level(0.5) == pytest.approx(0.0)
    assert not bucket.try_take(0.25)  # still in debt
    assert bucket.take(10.0, 100) == 0.0  # long idle: refilled to its capacity only
    assert bucket.take(10.0, 100) == pytest.approx(0.1)


@pytest.mark.parametrize("peer, address", [("ipv4:127.0.0.1:5555", "127.0.0.1"), ("ipv6:[::1]:80", "::1"),
                                           ("unix:/tmp/sock", "unix:/tmp/sock")])
def test_peer_address_drops_the_port(peer, address):
    assert peer_address(peer) == address


def test_token_bucket_per_address():
    now = [0.0]
    limiter = RateLimiter(rate_per_s=2.0, burst=3, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]  # the burst, then no more
    assert limiter.allow("b")  # another address has its own bucket
    now[0] = 0.5  # one token back after half a second at 2/s
    assert limiter.allow("a") and not limiter.allow("a")
    now[0] = 100.0  # refills to the burst, not beyond
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]


def test_zero_rate_means_no_limit():
    limiter = RateLimiter(0.0, 1)
    assert all(limiter.allow("a") for _ in range(1000))


def test_bounded_memory():
    now = [0.0]
    limiter = RateLimiter(1.0, 1, clock=lambda: now[0], max_keys=100)
    for i in range(1000):
        now[0] += 0.001
        limiter.allow(f"10.0.{i // 256}.{i % 256}")
    assert len(limiter.buckets) <= 100
