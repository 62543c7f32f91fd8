import pytest

from cotrain.coordinator.ratelimit import RateLimiter, peer_address


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
