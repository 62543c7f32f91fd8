"""Butterfly all-reduce over the :class:`Exchange`, with a pluggable codec and aggregator.

The group (sorted peer ids) splits the vector into one part per reducer; reducer i reduces part i (every peer, or
for a small vector fewer of them, :func:`choose_reducers`):

1. every peer publishes its encoded part j (with its weight) for reducer j;
2. reducer i fetches part i from every groupmate, decodes, weighs each by the work it shows
   (:func:`cotrain.averaging.work.credited_weights`), aggregates them (weighted mean, or a robust aggregator) in
   peer order, encodes the result and publishes it with those credited weights;
3. every peer fetches each reduced part from its reducer and decodes it. A member's credited weight is the lower
   median of what the reducers credited it with (a reducer cannot raise it alone), the same on every member.

Peers that nobody can dial (``reducers[i]`` false: behind NAT, in client mode) reduce no part: they send their
contributions to the reducers and fetch the results over connections they opened themselves, so two of them never
need to reach each other. Everyone decodes the very same bytes, so every peer ends with a bitwise-identical average. Each peer sends
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

from cotrain.averaging.exchange import UNARY_MAX_BYTES, Exchange
from cotrain.averaging.work import credited_weights
from cotrain.compression import Codec
from cotrain.verification.witness import (DIGEST_BYTES, MAX_SIGNATURE_BYTES, PartSeen, PartSigning, pack_signed,
                                          part_digest, unpack_signed)

Aggregator = Callable[[list[torch.Tensor], list[float]], torch.Tensor]


class AllReduceFailed(RuntimeError):
    pass


def weighted_mean(parts: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    total = sum(weights)
    out = torch.zeros_like(parts[0])
    for p, w in zip(parts, weights):
        out.add_(p, alpha=w / total)
    return out


def reducer_flags(n: int, reducers: Optional[Sequence[bool]]) -> list[bool]:
    """Who reduces a part: the peers others can dial, or everyone when none can (then they must reach each other
    anyway) or nothing is known."""
    return [bool(r) for r in reducers] if reducers is not None and any(reducers) else [True] * n


def choose_reducers(n: int, reducers: Optional[Sequence[bool]], numel: int, min_part_values: int,
                    tag: str) -> list[bool]:
    """Who reduces a part of a vector of ``numel`` values: as many of the dialable peers (:func:`reducer_flags`) as
    give every part ``min_part_values`` values at least (one at the least; 0: all of them), taken in turn from a
    place the round's ``tag`` sets, so that the work moves round to round. Every member computes the same.

    Each reducer costs every member a request for its result, and each member costs it a request for its part: a
    butterfly of n reducers is 2 n (n - 1) requests, one reducer 2 (n - 1). For a small vector the requests are the
    round's cost (on loopback a request takes 1-2 ms of CPU, moving 100 KB about as much), for a large one the bytes
    are, and the butterfly spreads those evenly."""
    dialable = [i for i, r in enumerate(reducer_flags(n, reducers)) if r]
    if min_part_values <= 0:
        count = len(dialable)
    else:
        count = max(1, min(len(dialable), numel // min_part_values))
    start = int(hashlib.sha1(tag.encode()).hexdigest()[:8], 16) % len(dialable)
    chosen = {dialable[(start + k) % len(dialable)] for k in range(count)}
    return [i in chosen for i in range(n)]


def part_bounds(numel: int, n: int, reducers: Optional[Sequence[bool]] = None) -> list[tuple[int, int]]:
    """Peer i reduces [a_i, b_i): equal parts for the reducers, empty ones for the others."""
    reducers = reducer_flags(n, reducers)
    edges = np.linspace(0, numel, sum(reducers) + 1).astype(np.int64)
    out, k = [], 0
    for i in range(n):
        if reducers[i]:
            out.append((int(edges[k]), int(edges[k + 1])))
            k += 1
        else:
            out.append((int(edges[k]), int(edges[k])))
    return out


def group_tag(prefix: str, peers: Sequence[str]) -> str:
    return f"{prefix}-{hashlib.sha1('|'.join(peers).encode()).hexdigest()[:12]}"


@dataclass
class AllReduceResult:
    average: torch.Tensor
    sent: torch.Tensor  # this peer's contribution as its reducers decoded it (for error feedback)
    contributors: list[int]  # per part: how many peers' contributions were aggregated
    dropped: dict[str, str] = field(default_factory=dict)  # peer -> why its contribution was left out
    seconds: float = 0.0
    #: peer -> the weight its contribution was credited with (:func:`credited`), the same on every member
    credits: dict[str, float] = field(default_factory=dict)
    #: what this peer reduced of its groupmates' contributions, each signed by its member (``signing`` on)
    seen: list[PartSeen] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every part aggregated every groupmate's contribution."""
        return all(c == len(self.contributors) for c in self.contributors)


def butterfly_allreduce(exchange: Exchange, tag: str, group: Sequence, me, vector: torch.Tensor, weight: float,
                        codec: Codec, timeout: float, aggregator: Aggregator = weighted_mean,
                        reducers: Optional[Sequence[bool]] = None, min_part_values: int = 0,
                        signing: Optional[PartSigning] = None) -> AllReduceResult:
    """Average ``vector`` (flat float32) with ``group`` (PeerIDs, the same order on every peer, ``me`` among them).
    ``reducers``: which peers others can dial (the same on every peer; None: all). ``min_part_values``: the fewest
    values a reducer's part may hold (:func:`choose_reducers`; 0: every dialable peer reduces a part). ``signing``
    (verification): every part sent is signed, a part taken in whose signature does not hold is left out, and what
    this peer reduced of each groupmate's is noted (``AllReduceResult.seen``)."""
    started = time.monotonic()
    group = list(group)
    names = [str(p) for p in group]
    n, mine = len(group), names.index(str(me))
    flags = choose_reducers(n, reducers, vector.numel(), min_part_values, tag)
    bounds = part_bounds(vector.numel(), n, flags)
    reducing = [j for j in range(n) if flags[j]]
    vector = vector.detach().float().cpu().reshape(-1)
    sent = torch.empty_like(vector)
    encoded = {}
    for j in reducing:
        a, b = bounds[j]
        encoded[j] = codec.encode(vector[a:b])
        sent[a:b] = codec.decode(encoded[j], b - a)
    whole = part_digest(sent) if signing is not None else b""  # what every part's signature names it a part of
    own_parts = {j: _piece(weight, encoded[j], sent, *bounds[j], signing, whole) for j in reducing}
    for j in reducing:
        if j != mine:  # reducer j reads it
            exchange.publish(tag, f"{tag}/in/{j}/{names[mine]}", own_parts[j], readers=1)

    average = torch.empty_like(vector)
    contributors = [n] * n  # a part nobody reduces (an empty one) lacks no contribution
    dropped: dict[str, str] = {}
    seen: list = []
    if mine in reducing:
        own_result = _reduce_part(exchange, tag, group, names, mine, bounds[mine], own_parts[mine], codec, timeout,
                                  aggregator, dropped, signing, seen)
    # gather every reduced part
    requests = [(group[j], f"{tag}/out/{j}") for j in reducing if j != mine]
    largest = max(b - a for a, b in bounds)
    fetched = dict(zip([j for j in reducing if j != mine], exchange.fetch_many(
        requests, wait_s=timeout, large=_streams(largest), max_bytes=_header_bytes(n) + encoded_bound(largest))))
    if mine in reducing:
        fetched[mine] = own_result
    credits = []
    for j in reducing:
        payload = fetched[j]
        if payload is None:
            raise AllReduceFailed(f"reduced part {j} from peer {names[j][-8:]} did not arrive within {timeout:.0f}s")
        lo, hi = bounds[j]
        try:
            contributors[j], part_credits, encoded = _unpack_result(payload, n)
            average[lo:hi] = codec.decode_result(encoded, hi - lo)
        except (ValueError, struct.error) as e:
            raise AllReduceFailed(f"reduced part {j} from peer {names[j][-8:]} is malformed: {e}") from None
        credits.append(part_credits)
    return AllReduceResult(average, sent, contributors, dropped, time.monotonic() - started,
                           credits=agreed_credits(names, credits), seen=seen)


def _reduce_part(exchange: Exchange, tag: str, group: list, names: list[str], mine: int, bounds: tuple[int, int],
                 own: bytes, codec: Codec, timeout: float, aggregator: Aggregator, dropped: dict,
                 signing: Optional[PartSigning], seen: list) -> bytes:
    """Reducer ``mine``: fetch every groupmate's contribution to its part (``own``: this peer's piece,
    :func:`_piece`), aggregate, publish the result; -> the result as published (:func:`_pack_result`).
    Contributions left out are named in ``dropped``; with ``signing``, what it took in of each groupmate's goes to
    ``seen``."""
    a, b = bounds
    others = [(p, f"{tag}/in/{mine}/{name}") for p, name in zip(group, names) if name != names[mine]]
    fetched = exchange.fetch_many(others, wait_s=timeout, large=_streams(b - a), max_bytes=piece_bound(b - a))
    took: list = []
    result = _aggregate(names, _insert(fetched, mine, own), (a, b), codec, aggregator, dropped,
                        reputation_of(exchange), signing, took)
    seen.extend(part for part in took if part.member != names[mine])
    exchange.publish(tag, f"{tag}/out/{mine}", result, readers=len(group) - 1)  # every groupmate gathers every part
    return result


def full_reputation(peer: str) -> float:
    return 1.0


def reputation_of(exchange) -> Callable[[str], float]:
    """The weights verification gives the peers, from the credentials the exchange's admission checked (1 each when
    it keeps none: an in-memory exchange)."""
    admission = getattr(exchange, "admission", None)
    return getattr(admission, "reputation", full_reputation)


def _piece(weight: float, encoded: bytes, decoded: torch.Tensor, start: int, end: int,
           signing: Optional[PartSigning], whole: bytes) -> bytes:
    """What a member sends a reducer of its part [start, end) of ``decoded`` (its whole contribution as reducers
    decode it, whose digest is ``whole``): its weight, then (with ``signing``) the digest and its signature, then the
    encoded values."""
    if signing is not None:  # the whole contribution's digest is the part's when the part is all of it
        digest = whole if (start, end) == (0, decoded.numel()) else part_digest(decoded[start:end])
        encoded = pack_signed(whole, signing.sign(start, end, digest, whole), encoded)
    return struct.pack("<d", weight) + encoded


def piece_bound(values: int) -> int:
    """The most bytes a member's piece of ``values`` values takes (:func:`_piece`)."""
    return 8 + DIGEST_BYTES + 2 + MAX_SIGNATURE_BYTES + encoded_bound(values)


def _aggregate(names: Sequence[str], payloads: Sequence[Optional[bytes]], span: tuple[int, int], codec: Codec,
               aggregator: Aggregator, dropped: dict, reputation: Callable[[str], float] = full_reputation,
               signing: Optional[PartSigning] = None, took: Optional[list] = None) -> bytes:
    """Aggregate the contributions (weight, then the encoded values; None: none came) in ``names``' order, each
    weighted by the work it shows times the member's ``reputation`` (verification: what its newest credential
    says). -> the result (:func:`_pack_result`: how many were aggregated, each name's
    credited weight, 0 for those left out, and the encoded aggregate). Those left out are named in ``dropped``, with
    why; the caller's own is among them and is valid, so at least one is aggregated. ``span``: where the part lies
    in the flat contribution. With ``signing`` each payload carries its member's signature of the decoded values,
    and one whose signature does not hold is left out; ``took`` gets each part taken in (:class:`PartSeen`): what a
    validator binds the member's evidence to."""
    numel = span[1] - span[0]
    parts, weights, kept = [], [], []
    for name, payload in zip(names, payloads):
        if payload is None:
            dropped[name] = "its contribution did not arrive in time"
            continue
        try:
            (w,) = struct.unpack("<d", payload[:8])
            whole, signature, encoded = unpack_signed(payload[8:]) if signing is not None else (b"", b"", payload[8:])
            part = codec.decode(encoded, numel)
        except (ValueError, struct.error) as e:
            dropped[name] = f"malformed contribution: {e}"
            continue
        if signing is not None:
            seen = PartSeen(signing.round, name, *span, part_digest(part), signature, whole)
            if not signing.valid(seen):
                dropped[name] = "its part is not signed by its record key"
                continue
            if took is not None:
                took.append(seen)
        if not (np.isfinite(w) and w > 0):
            dropped[name] = f"bad weight {w}"
            continue
        if not torch.isfinite(part).all():
            dropped[name] = "non-finite values (NaN or Inf)"
            continue
        parts.append(part)
        weights.append(w)
        kept.append(name)
    # the reputation scales what the work shows: applied to the claims, it would lower the group's median too
    credited = [c * reputation(name) for c, name in zip(credited_weights(parts, weights), kept)]
    by_name = dict(zip(kept, credited))
    return _pack_result(len(parts), [by_name.get(name, 0.0) for name in names],
                        codec.encode_result(aggregator(parts, credited)))


def _pack_result(count: int, credits: Sequence[float], encoded: bytes) -> bytes:
    return struct.pack(f"<IH{len(credits)}d", count, len(credits), *credits) + encoded


def _header_bytes(n: int) -> int:
    return 6 + 8 * n


def _unpack_result(payload: bytes, n: int) -> tuple[int, list[float], bytes]:
    """A reduced part from a peer (hostile) -> (contributions aggregated, the group's n credited weights, the
    encoded aggregate). Raises ValueError naming what is wrong."""
    count, k = struct.unpack("<IH", payload[:6])
    if k != n:
        raise ValueError(f"credits: {k} weights for a group of {n}")
    if count > n:
        raise ValueError(f"contributors: {count} in a group of {n}")
    credits = list(struct.unpack(f"<{n}d", payload[6:_header_bytes(n)]))
    if not all(np.isfinite(c) and c >= 0 for c in credits):
        raise ValueError("credits: a weight that is negative or not finite")
    return count, credits, payload[_header_bytes(n):]


def agreed_credits(names: Sequence[str], credits: Sequence[Sequence[float]]) -> dict[str, float]:
    """Each member's credited weight: the lower median over the reduced parts of what their reducers credited it
    with (``credits``: one list in ``names``' order per part). Every member computes it from the same bytes."""
    if not credits:
        return {}
    return {name: sorted(c[i] for c in credits)[(len(credits) - 1) // 2] for i, name in enumerate(names)}


# ---- the all-reduce a board group's host does at its meeting ----------------------------------------------------

def hosted(numel: int, min_part_values: int) -> bool:
    """Whether a board group's all-reduce of ``numel`` values rides with its meeting: when the butterfly would have
    one reducer anyway (:func:`choose_reducers`), the host is that reducer. Each member's contribution comes with its
    meeting and the result goes back with the host's roster: a round is n - 1 requests and two hops (a member's
    join carrying its piece to the host, the host's answer back) instead of 5 (n - 1) and five, and the host moves
    the same bytes the single reducer did. On loopback with 2 cores a request costs 1-2 ms of CPU, which for a small vector is the
    round's cost."""
    return min_part_values > 0 and numel // min_part_values <= 1


def contribution_piece(vector: torch.Tensor, weight: float, codec: Codec,
                       signing: Optional[PartSigning] = None) -> tuple[bytes, torch.Tensor]:
    """A member's whole contribution to a hosted all-reduce (:func:`_piece` of all of it), and the vector as the
    host will decode it (for error feedback)."""
    vector = vector.detach().float().cpu().reshape(-1)
    encoded = codec.encode(vector)
    decoded = codec.decode(encoded, vector.numel())
    whole = part_digest(decoded) if signing is not None else b""
    return _piece(weight, encoded, decoded, 0, vector.numel(), signing, whole), decoded


def hosted_reduce(pieces: dict[str, Optional[bytes]], numel: int, codec: Codec, aggregator: Aggregator,
                  dropped: dict, reputation: Callable[[str], float] = full_reputation,
                  signing: Optional[PartSigning] = None, took: Optional[list] = None) -> bytes:
    """The host's side: aggregate the group's contributions (peer id -> piece from :func:`contribution_piece`, the
    host's own included; None or empty: none came) in id order -> the result every member decodes
    (:func:`hosted_average`). Those left out are named in ``dropped``; ``signing`` and ``took`` as
    :func:`_aggregate`'s."""
    names = sorted(pieces)
    return _aggregate(names, [pieces[name] or None for name in names], (0, numel), codec, aggregator, dropped,
                      reputation, signing, took)


def hosted_average(result: bytes, names: Sequence[str], numel: int,
                   codec: Codec) -> tuple[int, torch.Tensor, dict[str, float]]:
    """A member's side: the host's result for the group ``names`` (every member's id) -> (contributions it
    aggregated, the average, each member's credited weight). Raises AllReduceFailed for bytes that are no result
    (they come from a peer)."""
    if not result:
        raise AllReduceFailed("the group's host sent no result with its roster")
    names = sorted(names)
    try:
        count, credits, encoded = _unpack_result(result, len(names))
        return count, codec.decode_result(encoded, numel), dict(zip(names, credits))
    except (ValueError, struct.error) as e:
        raise AllReduceFailed(f"the group's host sent a malformed result: {e}") from None


def encoded_bound(values: int) -> int:
    """The most bytes any one-pass codec's encoding of ``values`` values takes, with room for its header (top-k of
    every value, or its result: a 4-byte index and an int8 value with its block's scale, about 5 bytes a value; fp32:
    4): what a fetch of a part, a contribution or a result takes in at most from a peer."""
    return 8 * values + 4096


def _streams(values: int) -> bool:
    """Whether a part of ``values`` values may be too large for one answer (as fp32, the most any codec sends)."""
    return values * 4 > UNARY_MAX_BYTES


def _insert(items: list, index: int, value) -> list:
    return items[:index] + [value] + items[index:]
