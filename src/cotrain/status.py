"""``cotrain swarm status``: the swarm's health as a table or as JSON."""

from __future__ import annotations

import json
import math
import time


from cotrain.v1 import coordinator_pb2 as pb


def message_to_dict(message) -> dict:
    """A protobuf message as plain JSON-able Python: numbers stay numbers (protobuf's own JSON form turns 64-bit
    integers into strings), NaN becomes None, every field is present."""
    out = {}
    for f in message.DESCRIPTOR.fields:
        value = getattr(message, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            out[f.name] = {k: _plain(v) for k, v in value.items()}
        elif f.is_repeated:
            out[f.name] = [message_to_dict(v) if f.message_type else _plain(v) for v in value]
        elif f.message_type is not None:
            out[f.name] = message_to_dict(value)
        else:
            out[f.name] = _plain(value)
    return out


def _plain(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def health_json(health: pb.SwarmHealth) -> str:
    return json.dumps(message_to_dict(health), indent=1, sort_keys=True)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _fmt_names(names, at_most: int = 3) -> str:
    shown = ", ".join(list(names)[:at_most])
    return (shown + (f" +{len(names) - at_most}" if len(names) > at_most else "")) or "-"


def health_table(health: pb.SwarmHealth):
    """A rich renderable: one row per node, then totals and alerts."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    now = health.now_unix or time.time()
    table = Table(title=f"swarm {health.run_id}", expand=False)
    for column in ("node", "state", "reach", "step", "round", "loss", "samples/s", "bytes/s", "sent", "received", "memory",
                   "last group", "units", "last seen"):
        table.add_column(column, justify="left" if column in ("node", "state", "reach") else "right")
    for node in health.nodes:
        m = node.metrics
        loss = f"{m.loss:.3f}" if math.isfinite(m.loss) else str(m.loss)
        style = {"healthy": "green", "straggler": "yellow", "lost": "red", "left": "dim"}.get(node.state, "")
        table.add_row(node.node_name, Text(node.state, style=style), node.reachability or "-", str(m.step), str(m.round), loss,
                      f"{m.samples_per_s:.1f}", _fmt_bytes(node.bytes_per_s) + "/s", _fmt_bytes(m.bytes_sent),
                      _fmt_bytes(m.bytes_received), _fmt_bytes(m.memory_bytes) if m.memory_bytes else "-",
                      _fmt_names(node.groupmates),
                      f"{m.units_done} done" + "".join(f", {u}" for u in node.units),
                      f"{max(0.0, now - node.last_seen_unix):.0f}s ago")
    t = health.totals
    if math.isfinite(t.val_bpc):
        val = f"{t.val_bpc:.3f} BPC (round {t.val_round})"
    elif math.isfinite(t.val_loss):
        extra = t.val_metrics.get("normalized_mse")
        val = f"NLL {t.val_loss:.3f}" + (f", MSE {extra:.3f}x copy-last-state" if extra is not None else "")
        val += f" (round {t.val_round})"
    else:
        val = "not yet"
    lines = [
        f"nodes online {t.nodes_online}   samples/s {t.samples_per_s:.1f}   global round {t.global_round}   "
        f"samples {t.samples_total}   sent {_fmt_bytes(t.bytes_sent)}",
        f"validation {val}   checkpoint {t.latest_checkpoint or 'none yet'}",
        f"work units of epoch {t.epoch}: {t.units_done}/{t.units_total} done, {t.units_in_progress} in progress, "
        f"{t.units_pending} pending, {t.units_reissued} reissued" + (f" ({t.scheduling_reason})"
                                                                      if t.scheduling_reason else ""),
    ]
    checked = [n for n in health.nodes if n.HasField("verification")]
    for node in checked:  # verification: what the coordinator's checks found, in words
        v = node.verification
        lines.append(f"checks of {node.node_name}: {v.checks - v.failed}/{v.checks} passed "
                     f"({v.replayed} replayed), reputation "
                     f"{v.reputation:.2f}" + (", SUSPENDED" if v.suspended else "") + f": {v.reason}")
    lines.extend(experts_lines(health))
    parts = [table, Text("\n".join(lines))]
    if health.alerts:
        parts.append(Text("\n".join(f"! {a}" for a in health.alerts), style="yellow"))
    return Group(*parts)


def experts_lines(health) -> list[str]:
    """A hosted mixture's experts in words: how many have a host, each host's experts and the calls they answered,
    the calls per expert (its load), and the trainers' failed calls and skipped steps. None for other runs."""
    if not health.HasField("experts"):
        return []
    e = health.experts
    lines = [f"experts: {e.hosted} of {e.experts} hosted by {len(e.hosts)} host(s) ({e.reason})"]
    load: dict[str, int] = {}
    for h in e.hosts:
        calls = sum(x.forward + x.backward for x in h.served)
        for x in h.served:
            load[x.uid] = load.get(x.uid, 0) + x.forward + x.backward
        lines.append(f"  host {h.node_name}: {len(h.holds)} of {h.capacity} expert(s), {calls} calls answered, "
                     f"{h.refused} refused" + (f": {', '.join(h.holds[:8])}" + (" ..." if len(h.holds) > 8 else "")
                                               if h.holds else ""))
    if load:
        lines.append("  calls per expert: " + ", ".join(f"{u} {c}" for u, c in sorted(load.items())[:32]))
    failed = sum(n.metrics.expert_calls_failed for n in health.nodes)
    skipped = sum(n.metrics.steps_skipped for n in health.nodes)
    lines.append(f"  trainers: {failed} expert calls failed, {skipped} steps skipped for too few experts")
    return lines
