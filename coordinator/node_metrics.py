"""A node's metrics: checked on their way in from a heartbeat (or a Leave), kept as a dict, and sent back out in the
health view.

Every field a node reports is bounded here before the service keeps it: peer-id lists by count and length, rates
by sign and finiteness. A NaN loss is kept (the health view flags it); a NaN lr means no step was taken yet.
"""

from __future__ import annotations

import math

from cotrain.v1 import coordinator_pb2 as pb

METRIC_FIELDS = ("step", "round", "loss", "samples_per_s", "bytes_sent", "bytes_received", "samples_total", "epoch",
                 "partial_rounds", "rounds_completed", "samples_local", "compute_s", "wall_s", "state_bytes_sent",
                 "state_bytes_received", "peer_id", "units_done", "refused", "groups_from_board", "groups_matchmade",
                 "meet_s", "allreduce_s", "memory_bytes", "processes", "heartbeat_ms", "lr", "expert_calls_failed",
                 "steps_skipped")


class InvalidMetrics(ValueError):
    """A metric out of its bounds; the message names the field, and the service answers INVALID_ARGUMENT with it."""


def metrics_dict(m: pb.NodeMetrics) -> dict:
    """The metrics as stored; a NaN loss is kept (the health view flags it), a bad rate is refused."""
    out = {name: getattr(m, name) for name in METRIC_FIELDS}
    if len(out["peer_id"]) > 128 or len(m.flagged_peers) > 64 or any(len(p) > 128 for p in m.flagged_peers):
        raise InvalidMetrics("metrics.peer_id / metrics.flagged_peers: too long")
    if len(m.refused_peers) > 64 or any(len(p) > 128 for p in m.refused_peers):
        raise InvalidMetrics("metrics.refused_peers: at most 64 peer ids of at most 128 characters")
    if len(m.last_group) > 64 or any(len(p) > 128 for p in m.last_group):
        raise InvalidMetrics("metrics.last_group: at most 64 peer ids of at most 128 characters")
    out["last_group"] = list(m.last_group)
    out["flagged_peers"] = list(m.flagged_peers)
    out["refused_peers"] = list(m.refused_peers)
    for name in ("samples_per_s", "meet_s", "allreduce_s", "heartbeat_ms"):
        if not math.isfinite(out[name]) or out[name] < 0:
            raise InvalidMetrics(f"metrics.{name}: must be finite and >= 0, got {out[name]}")
    if math.isinf(out["lr"]) or out["lr"] < 0:  # NaN: no step taken yet
        raise InvalidMetrics(f"metrics.lr: must be finite and >= 0, got {out['lr']}")
    return out


def metrics_message(stored: dict) -> pb.NodeMetrics:
    """The stored metrics (of :func:`metrics_dict`, or read back from the store) as the health view sends them."""
    return pb.NodeMetrics(**{k: v for k, v in stored.items() if k in METRIC_FIELDS},
                          flagged_peers=stored.get("flagged_peers", []), refused_peers=stored.get("refused_peers", []),
                          last_group=stored.get("last_group", []))
