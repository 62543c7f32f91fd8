"""Sparse all-gather over the :class:`Exchange`: how peers average payloads of the sparse codec.

A sparse payload is so small (~0.15 bits per parameter) that splitting it into parts for reducers, as the butterfly
all-reduce does, would cost more than it saves: a reducer's result is the union of its contributors' supports,
with values no 2-bit table holds, and sending it back to every peer outweighs the payload itself. So each peer
publishes its whole payload once, fetches every groupmate's, and aggregates them itself:

1. every peer encodes its vector and publishes the payload (with its weight);
2. every peer fetches every groupmate's payload, decodes it (refusing a malformed one, a bad weight, or one larger
   than the codec can produce), and averages each position over the peers whose payload holds it, in the group's
   order, so that every peer computes the same float32 result from the same bytes;
3. peers nobody can dial (behind NAT: ``reducers[i]`` false) fetch each other's payloads from the first dialable
   peer, which republishes every payload it fetched from such a peer.

A node serves its payload to each of the n - 1 others: (n - 1) x ~0.15 bits per parameter per round, against
2 (n - 1) / n x 32 for an fp32 butterfly. A payload that does not arrive is left out and counted, as in the
butterfly; a peer that got fewer payloads than its groupmates ends with a different state, which the next round's
state-hash check notices (it then downloads the group's state).

Aggregation: ``mean`` (each position's weighted mean over its senders) or ``clipped_mean`` (each contribution first
clipped to ``clip_multiple`` x the group's lower-median norm, weights credited by the work they show, as
:func:`cotrain.averaging.robust.clipped_mean` does for dense parts).
"""

from __future__ import annotations

import struct
import time
from typing import Optional, Sequence

import numpy as np
import torch

from cotrain.averaging.allreduce import AllReduceFailed, AllReduceResult, reducer_flags
from cotrain.averaging.exchange import Exchange
from cotrain.averaging.work import credited_weights, lower_median_of, radius_scales
from cotrain.compression.sparse import SparseLowBit, sparse_mean

SPARSE_AGGREGATIONS = ("mean", "clipped_mean")


def sparse_aggregate(supports: list[tuple[np.ndarray, np.ndarray]], weights: list[float], numel: int,
                     aggregation: str = "mean", clip_multiple: float = 2.0) -> torch.Tensor:
    """The group's average of sparse contributions (positions, values), in the group's order."""
    if aggregation == "mean":
        return sparse_mean(supports, weights, numel)
    if aggregation != "clipped_mean":
        raise ValueError(f"averaging.aggregation: the sparse codec averages with {' or '.join(SPARSE_AGGREGATIONS)}, "
                         f"not {aggregation!r}")
    norms = [float(np.sqrt(np.sum(np.square(v, dtype=np.float64)))) for _, v in supports]
    bound = clip_multiple * lower_median_of(norms) if norms else 0.0
    weights = [float(w) for w in weights]
    if len(weights) > 1 and max(weights) > lower_median_of(weights):  # a claim to check: its direction needs values
        credited = credited_weights([_dense(s, numel) for s in supports], weights, norms=norms)
    else:
        credited = weights
    bounds = [bound * r for r in radius_scales(credited)] if credited else []
    scales = [1.0 if n <= b else b / n for n, b in zip(norms, bounds)]
    return sparse_mean(supports, credited, numel, scales)


def _dense(support: tuple[np.ndarray, np.ndarray], numel: int) -> torch.Tensor:
    out = torch.zeros(numel, dtype=torch.float32)
    out[torch.from_numpy(np.asarray(support[0], dtype=np.int64))] = torch.from_numpy(
        np.asarray(support[1], dtype=np.float32))
    return out


def sparse_allgather(exchange: Exchange, tag: str, group: Sequence, me, vector: torch.Tensor, weight: float,
                     codec: SparseLowBit, timeout: float, aggregation: str = "mean", clip_multiple: float = 2.0,
                     reducers: Optional[Sequence[bool]] = None) -> AllReduceResult:
    """Average ``vector`` (flat float32) with ``group`` (PeerIDs, the same order on every peer, ``me`` among
    them). ``reducers``: which peers others can dial (the same on every peer; None: all). The result's
    ``contributors`` has one entry: how many payloads went into the average."""
    started = time.monotonic()
    group = list(group)
    names = [str(p) for p in group]
    n, mine = len(group), names.index(str(me))
    flags = reducer_flags(n, reducers)
    relay = next(j for j in range(n) if flags[j])  # the first dialable peer relays for those nobody can dial
    numel = vector.numel()
    payload = codec.encode(vector.detach().float().cpu().reshape(-1))
    own = struct.pack("<d", weight) + payload

    def source(k: int, j: int) -> int:
        """Whom peer k asks for peer j's payload: j itself, or the relay when neither of them can be dialled."""
        return j if (flags[j] or flags[k]) else relay

    def readers(j: int) -> int:
        """How many groupmates ask this peer for peer j's payload (see Exchange.publish)."""
        return sum(1 for k in range(n) if k not in (j, mine) and source(k, j) == mine)

    exchange.publish(tag, f"{tag}/in/{names[mine]}", own, readers=readers(mine))
    limit = 8 + codec.payload_bytes_bound(numel)

    sources = [source(mine, j) for j in range(n)]
    if not flags[mine] and not flags[relay]:
        raise AllReduceFailed("no groupmate can be dialled: nobody can relay payloads")
    wanted = [j for j in range(n) if j != mine]
    requests = [(group[sources[j]], f"{tag}/in/{names[j]}") for j in wanted]
    fetched = dict(zip(wanted, exchange.fetch_many(requests, wait_s=timeout, max_bytes=limit)))
    fetched[mine] = own
    if mine == relay:
        for j in wanted:  # republish what the undialable peers sent, for each other
            if not flags[j] and fetched[j] is not None:
                exchange.publish(tag, f"{tag}/in/{names[j]}", fetched[j], readers=readers(j))

    supports, weights, dropped = [], [], {}
    sent = None
    for j in range(n):
        data = fetched[j]
        if data is None:
            dropped[names[j]] = "its contribution did not arrive in time"
            continue
        if len(data) > limit:
            dropped[names[j]] = f"malformed contribution: {len(data)} bytes, at most {limit} possible"
            continue
        try:
            (w,) = struct.unpack("<d", data[:8])
            positions, values = codec.decode_sparse(data[8:], numel)
        except (ValueError, struct.error) as e:
            if j == mine:
                raise AllReduceFailed(f"our own payload does not decode: {e}") from e
            dropped[names[j]] = f"malformed contribution: {e}"
            continue
        if not (np.isfinite(w) and w > 0):
            dropped[names[j]] = f"bad weight {w}"
            continue
        if j == mine:
            sent = np.zeros(numel, dtype=np.float32)
            sent[positions] = values
        supports.append((positions, values))
        weights.append(w)
    if sent is None:
        raise AllReduceFailed(f"our own contribution was refused: {dropped.get(names[mine])}")
    average = sparse_aggregate(supports, weights, numel, aggregation, clip_multiple)
    return AllReduceResult(average, torch.from_numpy(sent), [len(supports)] * n, dropped, time.monotonic() - started)
