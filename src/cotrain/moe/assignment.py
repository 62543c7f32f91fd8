"""Which host holds which expert: the coordinator's decision, as a pure function of the grid and the hosts it knows.

Every expert of the grid is to have one host (Learning@home declares one peer per expert). Hosts come and go: an
expert whose host is gone, or that no host holds yet, goes to the host with the most room left (its ``capacity``,
what it said it will hold, less what it holds); an expert two hosts hold stays with one; a host holding more than
its capacity gives up the rest. The decision keeps what hosts hold where it can: moving an expert costs its
checkpoint's transfer and the calls made while it moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from cotrain.moe.gating import expert_uid, grid_experts


def run_experts(grid: Sequence[int], layers: int) -> list[str]:
    """Every expert of a run's mixture layers, by uid: ``moe<layer>.<i>.<j>``."""
    return [expert_uid(f"moe{layer}", cell) for layer in range(layers) for cell in grid_experts(grid)]


@dataclass(frozen=True)
class Host:
    node_id: str
    capacity: int  # experts it will hold at most
    holds: tuple[str, ...] = ()  # the experts it holds now, as it last said


@dataclass(frozen=True)
class ExpertPlan:
    #: node -> the experts it is to hold, in the grid's order
    holds: dict[str, tuple[str, ...]]
    #: the experts no host has room for
    unhosted: tuple[str, ...]
    #: the experts given a new host by this plan
    moved: tuple[str, ...]
    reason: str

    def host_of(self) -> dict[str, str]:
        """expert -> its host's node."""
        return {uid: node for node, uids in self.holds.items() for uid in uids}


def plan_experts(uids: Sequence[str], hosts: Sequence[Host]) -> ExpertPlan:
    """Where each of the grid's experts ``uids`` is to live, given the ``hosts`` alive now (hosts not listed are
    gone: their experts move)."""
    order = {uid: i for i, uid in enumerate(uids)}
    ranked = sorted(hosts, key=lambda h: h.node_id)
    holds: dict[str, list[str]] = {h.node_id: [] for h in ranked}
    taken: set[str] = set()
    dropped = 0
    for h in ranked:  # what each host holds stays, but twice-held experts, unknown ones and those past its capacity
        for uid in sorted(set(h.holds), key=lambda u: order.get(u, -1)):
            if uid in order and uid not in taken and len(holds[h.node_id]) < max(0, h.capacity):
                holds[h.node_id].append(uid)
                taken.add(uid)
            else:
                dropped += 1
    room = {h.node_id: max(0, h.capacity) - len(holds[h.node_id]) for h in ranked}
    position = {h.node_id: i for i, h in enumerate(ranked)}
    moved, unhosted = [], []
    for uid in uids:
        if uid in taken:
            continue
        node = max(room, key=lambda n: (room[n], -position[n]), default=None)  # the most room; ties: first node
        if node is None or room[node] <= 0:
            unhosted.append(uid)
            continue
        holds[node].append(uid)
        room[node] -= 1
        moved.append(uid)
    plan = {n: tuple(sorted(u, key=order.__getitem__)) for n, u in holds.items()}
    capacity = sum(max(0, h.capacity) for h in ranked)
    if unhosted:
        reason = (f"{len(unhosted)} of {len(uids)} experts have no host: {len(ranked)} host(s) hold at most "
                  f"{capacity}")
    elif moved:
        reason = f"{len(moved)} expert(s) given a host; every expert of {len(uids)} has one"
    else:
        reason = f"every expert of {len(uids)} has its host"
    if dropped:
        reason += f"; {dropped} held twice, unknown or past a host's capacity given up"
    return ExpertPlan(plan, tuple(unhosted), tuple(moved), reason)
