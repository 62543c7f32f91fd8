"""The run's work units as the coordinator holds them: the pure decisions of :mod:`workunits`, applied and persisted.

Every change is written to the :class:`Store` before it is applied in memory, so nothing is answered before the
units it changed are on disk and a restarted coordinator hands out the same units. The pool also keeps what the
health view shows of the scheduling: how many units were reissued and the latest reason in words. Methods return
their reasons; the caller logs them.
"""

from __future__ import annotations

from typing import Optional, Sequence

from cotrain.coordinator.store import Store
from cotrain.coordinator.workunits import (Key, SchedulingRules, Unit, complete_unit, current_epoch, finished_epochs,
                                           held_by, issue_unit, reclaim_units, unit_counts)


class UnitPool:
    """The units of the open epochs, split from ``ranges`` (:func:`workunits.plan_ranges`), each held for at most
    ``deadline_s``."""

    def __init__(self, store: Store, ranges: Sequence[tuple[int, int]], deadline_s: float):
        self.store, self.ranges = store, ranges
        self.units: dict[Key, Unit] = {(r.epoch, r.index): Unit(**r._asdict()) for r in store.load_units()}
        self.rules = SchedulingRules(deadline_s)
        self.reissued = 0
        self.reason = f"{len(ranges)} work units per epoch"

    def _save(self, changed: list[Unit]) -> None:
        """Persist, then apply: nothing is answered before the units it changed are on disk."""
        if changed:
            self.store.save_units(changed)
            self.units.update({u.key: u for u in changed})

    def reclaim(self, now: float, active: set[str]) -> list[str]:
        """Units whose holder is not in ``active`` or is past its deadline go back to pending: -> why, for each."""
        reclaimed = reclaim_units(now, self.units, active)
        if reclaimed:
            self._save([u for u, _ in reclaimed])
            self.reissued += len(reclaimed)
            self.reason = reclaimed[-1][1]
        return [why for _, why in reclaimed]

    def issue(self, now: float, node_id: str) -> tuple[Optional[Unit], str]:
        """The unit to hand ``node_id`` (None when none is free), and why."""
        changed, unit, reason = issue_unit(now, self.units, self.ranges, node_id, self.rules)
        self._save(changed)
        if unit is None:
            self.reason = reason
        return unit, reason

    def complete(self, now: float, node_id: str, key: Key) -> tuple[bool, str]:
        """``node_id`` reports unit ``key`` done: -> (accepted, why). Epochs finished before the current one's
        predecessor are forgotten, in the store and here."""
        done, accepted, reason = complete_unit(now, self.units, node_id, key)
        if done is not None:
            self._save([done])
            old = finished_epochs(self.units)
            if old:
                self.store.forget_epochs(old)
                for k in [k for k in self.units if k[0] in old]:
                    del self.units[k]
        return accepted, reason

    def held_by(self, node_id: str) -> list[Unit]:
        return held_by(self.units, node_id)

    def totals(self) -> dict:
        """The current epoch's unit counts and the scheduling state, as fields of ``SwarmTotals``."""
        epoch = current_epoch(self.units)
        counts = unit_counts(self.units, epoch)
        if counts["total"] == 0:  # not opened yet: every unit is pending
            counts.update(total=len(self.ranges), pending=len(self.ranges))
        return dict(epoch=epoch, units_total=counts["total"], units_pending=counts["pending"],
                    units_in_progress=counts["in_progress"], units_done=counts["done"], units_reissued=self.reissued,
                    scheduling_reason=self.reason)
