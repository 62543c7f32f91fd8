"""Butterfly all-reduce over the :class:`Exchange`, with a pluggable codec and aggregator.

The group (sorted peer ids) splits the vector into one part per peer; peer i reduces part i:

1. every peer publishes its encoded part j (with its weight) for reducer j;
2. reducer i fetches part i from every groupmate, decodes, aggregates them (weighted mean, or a robust
   aggregator) in peer order, encodes the result and publishes it;
3. every peer fetches each reduced part from its reducer and decodes it.

Everyone decodes the very same bytes, so every peer ends with a bitwise-identical average. Each peer sends
2 (n-1)/n of its encoded vector, as a ring all-reduce does. A contribution that does not arrive within the timeout
is left out and counted (never silently); a reduced part that does not arrive makes the round fail for that peer.
"""

from __future__ import annotations

import hashlib
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from cotrain.averaging.exchange import Exchange
from cotrain.compression import Codec

Aggregator = Callable[[list[torch.Tensor], list[float]], torch.Tensor]


class AllReduceFailed(RuntimeError):
    pass


def weighted_mean(parts: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    total = sum(weights)
    out = torch.zeros_like(parts[0])
    for p, w in zip(parts, weights):
        out.add_(p, alpha=w / total)
    return out


def part_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, numel, n + 1).astype(np.int64)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(n)]


def group_tag(prefix: str, peers: Sequence[str]) -> str:
    return f"{prefix}-{hashlib.sha1('|'.join(peers).encode()).hexdigest()[:12]}"


@dataclass
class AllReduceResult:
    average: torch.Tensor
    sent: torch.Tensor  # this peer's contribution as its reducers decoded it (for error feedback)
    contributors: list[int]  # per part: how many peers' contributions were aggregated
    dropped: dict[str, str] = field(default_factory=dict)  # peer -> why its contribution was left out
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        """Every part aggregated every groupmate's contribution."""
        return all(c == len(self.contributors) for c in self.contributors)


def butterfly_allreduce(exchange: Exchange, tag: str, group: Sequence, me, vector: torch.Tensor, weight: float,
                        codec: Codec, timeout: float, aggregator: Aggregator = weighted_mean) -> AllReduceResult:
    """Average ``vector`` (flat float32) with ``group`` (PeerIDs, the same order on every peer, ``me`` among them)."""
    started = time.monotonic()
    group = list(group)
    names = [str(p) for p in group]
    n, mine = len(group), names.index(str(me))
    bounds = part_bounds(vector.numel(), n)
    vector = vector.detach().float().cpu().reshape(-1)
    sent = torch.empty_like(vector)
    own_parts = {}
    for j, (a, b) in enumerate(bounds):
        encoded = codec.encode(vector[a:b])
        sent[a:b] = codec.decode(encoded, b - a)
        own_parts[j] = encoded
        exchange.publish(tag, f"{tag}/in/{j}/{names[mine]}", struct.pack("<d", weight) + encoded)

    # reduce my part
    a, b = bounds[mine]
    others = [(p, f"{tag}/in/{mine}/{name}") for p, name in zip(group, names) if name != names[mine]]
    fetched = exchange.fetch_many(others, wait_s=timeout)
    parts, weights, dropped = [], [], {}
    for name, payload in zip(names, _insert(fetched, mine, struct.pack("<d", weight) + own_parts[mine])):
        if payload is None:
            dropped[name] = "its contribution did not arrive in time"
            continue
        try:
            (w,) = struct.unpack("<d", payload[:8])
            part = codec.decode(payload[8:], b - a)
        except (ValueError, struct.error) as e:
            dropped[name] = f"malformed contribution: {e}"
            continue
        if not (np.isfinite(w) and w > 0):
            dropped[name] = f"bad weight {w}"
            continue
        if not torch.isfinite(part).all():
            dropped[name] = "non-finite values (NaN or Inf)"
            continue
        parts.append(part)
        weights.append(w)
    reduced = aggregator(parts, weights)
    encoded_result = codec.encode_result(reduced)
    exchange.publish(tag, f"{tag}/out/{mine}", struct.pack("<I", len(parts)) + encoded_result)

    # gather every reduced part
    average = torch.empty_like(vector)
    contributors = [0] * n
    requests = [(p, f"{tag}/out/{j}") for j, p in enumerate(group) if j != mine]
    results = _insert(exchange.fetch_many(requests, wait_s=timeout), mine,
                      struct.pack("<I", len(parts)) + encoded_result)
    for j, payload in enumerate(results):
        if payload is None:
            raise AllReduceFailed(f"reduced part {j} from peer {names[j][-8:]} did not arrive within {timeout:.0f}s")
        lo, hi = bounds[j]
        try:
            (contributors[j],) = struct.unpack("<I", payload[:4])
            average[lo:hi] = codec.decode_result(payload[4:], hi - lo)
        except (ValueError, struct.error) as e:
            raise AllReduceFailed(f"reduced part {j} from peer {names[j][-8:]} is malformed: {e}") from None
    return AllReduceResult(average, sent, contributors, dropped, time.monotonic() - started)


def _insert(items: list, index: int, value) -> list:
    return items[:index] + [value] + items[index:]
