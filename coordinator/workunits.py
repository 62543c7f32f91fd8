"""Work units: the run's data split into pieces handed out with deadlines, as volunteer-computing systems do.

For a language model a unit is a byte range of the training split; for a world model it is a quota of rollouts
(``env.episodes``, from a seed of its own) that the node collects and trains on. In an epoch every unit is trained
once, unless reissued: a unit whose holder stops heartbeating, leaves, or passes the unit's deadline goes back to
the pending pool and is handed to the next node that asks. When the current epoch has no pending unit left but some
are still in progress, the next epoch opens early, so fast nodes never idle behind a slow one.

Every decision is a pure function of (now, units, rules) that returns what changes and the reason in words; the
service persists the changed units before it answers, logs the reason, and the health view shows it. Tests drive
them with plain numbers for ``now``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

PENDING, IN_PROGRESS, DONE = "pending", "in_progress", "done"

Key = tuple[int, int]  # (epoch, index)


@dataclass(frozen=True)
class Unit:
    epoch: int
    index: int
    start: int  # language models: byte range of the training split; world models: [index, index + 1)
    end: int
    state: str = PENDING
    holder: str = ""  # node id while in progress; the node that finished it once done
    deadline: float = 0.0
    attempts: int = 0  # times handed out

    @property
    def key(self) -> Key:
        return self.epoch, self.index

    @property
    def name(self) -> str:
        return f"{self.epoch}/{self.index}"

    def seed(self, run_seed: int) -> int:
        """The unit's own seed (world models collect their rollouts from it): the same wherever it runs."""
        digest = hashlib.sha256(f"{run_seed}:{self.epoch}:{self.index}".encode()).digest()
        return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@dataclass(frozen=True)
class SchedulingRules:
    #: seconds a node may hold a unit; past it the unit is reissued (size it to several times a unit's work)
    deadline_s: float
    #: epochs beyond the current one whose units may be handed out while the current one finishes
    lookahead_epochs: int = 1


def plan_ranges(train_start: int, train_end: int, unit_bytes: int, min_unit_bytes: int,
                max_units: int = 4096) -> list[tuple[int, int]]:
    """Split the training range into contiguous units of about ``unit_bytes``, none smaller than
    ``min_unit_bytes`` (a node's batch must fit in a unit) and at most ``max_units`` of them."""
    size = train_end - train_start
    if size <= 0:
        return []
    wanted = -(-size // max(unit_bytes, 1))  # ceil: the remainder is spread over the units, none is oversized
    count = max(1, min(wanted, size // max(min_unit_bytes, 1), max_units))
    edges = [train_start + (size * i) // count for i in range(count + 1)]
    return [(edges[i], edges[i + 1]) for i in range(count)]


def open_epoch(epoch: int, ranges: Sequence[tuple[int, int]]) -> list[Unit]:
    return [Unit(epoch, i, start, end) for i, (start, end) in enumerate(ranges)]


def current_epoch(units: Mapping[Key, Unit]) -> int:
    """The oldest epoch with a unit not done (or the next one when every known unit is done)."""
    open_epochs = {u.epoch for u in units.values() if u.state != DONE}
    if open_epochs:
        return min(open_epochs)
    return max((u.epoch for u in units.values()), default=-1) + 1


def held_by(units: Mapping[Key, Unit], node_id: str) -> list[Unit]:
    return sorted((u for u in units.values() if u.state == IN_PROGRESS and u.holder == node_id), key=lambda u: u.key)


def issue_unit(now: float, units: Mapping[Key, Unit], ranges: Sequence[tuple[int, int]], node_id: str,
               rules: SchedulingRules) -> tuple[list[Unit], Optional[Unit], str]:
    """The unit to hand ``node_id``: -> (units to store, the unit or None, reason).

    A node that asks while it holds a unit gets that unit again (its answer may have been lost); otherwise the
    lowest pending unit of the current epoch, else of the next ``lookahead_epochs`` epochs (opened as needed)."""
    holding = [u for u in held_by(units, node_id) if u.deadline > now]
    if holding:
        unit = holding[0]
        return [], unit, f"unit {unit.name} is still this node's (until its deadline)"
    if not ranges:
        return [], None, "the run has no training data to split into units"
    changed: list[Unit] = []
    first = current_epoch(units)
    for epoch in range(first, first + rules.lookahead_epochs + 1):
        in_epoch = [u for u in units.values() if u.epoch == epoch]
        if not in_epoch:
            in_epoch = open_epoch(epoch, ranges)
            changed.extend(in_epoch)
        pending = sorted((u for u in in_epoch if u.state == PENDING), key=lambda u: u.index)
        if pending:
            unit = dataclasses.replace(pending[0], state=IN_PROGRESS, holder=node_id, deadline=now + rules.deadline_s,
                                       attempts=pending[0].attempts + 1)
            changed = [u for u in changed if u.key != unit.key] + [unit]
            again = f", attempt {unit.attempts}" if unit.attempts > 1 else ""
            return changed, unit, f"unit {unit.name} of epoch {epoch} ({len(pending) - 1} more pending{again})"
    busy = sum(1 for u in units.values() if u.state == IN_PROGRESS)
    return changed, None, (f"no unit free: {busy} in progress through epoch {first + rules.lookahead_epochs}; "
                           f"ask again when one is done or reissued")


def reclaim_units(now: float, units: Mapping[Key, Unit], active: set[str]) -> list[tuple[Unit, str]]:
    """Units in progress whose holder is gone (lost, left) or whose deadline passed, back to pending, with why."""
    out = []
    for unit in sorted(units.values(), key=lambda u: u.key):
        if unit.state != IN_PROGRESS:
            continue
        if unit.holder not in active:
            why = f"unit {unit.name}: its node {unit.holder[:8]} is gone; reissued"
        elif unit.deadline <= now:
            why = f"unit {unit.name}: node {unit.holder[:8]} passed the deadline; reissued"
        else:
            continue
        out.append((dataclasses.replace(unit, state=PENDING, holder="", deadline=0.0), why))
    return out


def complete_unit(now: float, units: Mapping[Key, Unit], node_id: str, key: Key) -> tuple[Optional[Unit], bool, str]:
    """A node reports a unit done: -> (the unit to store or None, accepted, reason). The work of a node whose unit
    was reissued meanwhile still counts if nobody finished the unit first; a unit finished twice counts once."""
    unit = units.get(key)
    name = f"{key[0]}/{key[1]}"
    if unit is None:
        return None, False, f"unit {name}: no such unit in the open epochs"
    if unit.state == DONE:
        who = "this node" if unit.holder == node_id else f"node {unit.holder[:8]}"
        return None, False, f"unit {name}: already done by {who}"
    late = unit.state == PENDING or unit.holder != node_id
    done = dataclasses.replace(unit, state=DONE, holder=node_id, deadline=now)
    return done, True, f"unit {name} done" + (" (after it was reissued)" if late else "")


def finished_epochs(units: Mapping[Key, Unit]) -> list[int]:
    """Finished epochs whose units can be forgotten: all but the newest finished one, which keeps
    :func:`current_epoch` right."""
    current = current_epoch(units)
    return sorted({u.epoch for u in units.values() if u.epoch < current - 1})


def unit_counts(units: Mapping[Key, Unit], epoch: int) -> dict[str, int]:
    in_epoch = [u for u in units.values() if u.epoch == epoch]
    counts = {PENDING: 0, IN_PROGRESS: 0, DONE: 0}
    for u in in_epoch:
        counts[u.state] += 1
    return dict(total=len(in_epoch), pending=counts[PENDING], in_progress=counts[IN_PROGRESS], done=counts[DONE])
