"""Who averages in a round: the group forms at a meeting the progress board planned, or by hivemind's matchmaking.

:class:`GroupFormer` runs on the round's thread (the averaging worker with ``averaging.overlap``, else the main
thread). It takes the board's view and plan through callables the front (:class:`~cotrain.averaging.rounds.
RoundAverager`) gives it, so it always asks the view as it is when asked, and it returns what became of the try as
a value (:class:`Formation`). The one thing it keeps is the round of its last meeting (:attr:`GroupFormer.met_round`),
which the front reads to know whether this round's meeting was held: one int, written only here.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from hivemind.p2p import PeerID

from cotrain.averaging.admission import Admission
from cotrain.averaging.board_view import BoardView, board_time
from cotrain.averaging.clock import DhtClock
from cotrain.averaging.exchange import Exchange
from cotrain.averaging.matchmaking import round_group_bits
from cotrain.averaging.meet import hold_meeting
from cotrain.averaging.meeting import Meeting, host_key, meeting_key
from cotrain.averaging.overlap import PendingRound
from cotrain.averaging.progress import Phase, RoundRules
from cotrain.averaging.reduction import Hosting
from cotrain.config import AveragingConfig
from cotrain.outage import Repeats

logger = logging.getLogger(__name__)

#: this peer's planned group of a round and its host, from the board's view as of ``now`` (None: no group of two)
Plan = Callable[[BoardView, float], Optional[tuple[list[str], str]]]


@functools.lru_cache(maxsize=4096)
def peer_id_of(text: str) -> PeerID:
    """A peer id from its base58 text (raises ValueError for text that is none). Remembered: a round parsed every
    groupmate's id again (pure-Python base58, both ways), 4% of py-spy's samples of a node at 8 nodes ending ten
    rounds a second."""
    return PeerID.from_base58(text)


@dataclass(frozen=True)
class Formed:
    """A group that goes: its members (peer ids, sorted; this peer among them), what each said (``round``,
    ``samples``, ``hash``, ``reducer``, ``swarm``, ``contributed`` by peer id text), the host's reduced result
    when the all-reduce rode with the meeting (else empty), and whether it formed on the board (else by
    matchmaking)."""

    group: list
    info: dict
    hosted_result: bytes = b""
    from_board: bool = False


@dataclass(frozen=True)
class Formation:
    """What a try to form the round's group came to. ``formed``: the group, or None with ``reason``;
    ``disagreed``: the host or a groupmate planned another group (wait for a fresh read of the board before the next
    try); ``went``: this try went to a meeting (one that did not fill is held again at the next step)."""

    formed: Optional[Formed] = None
    reason: str = ""
    disagreed: bool = False
    went: bool = False


class GroupFormer:
    """Forms a round's group. :meth:`meet` goes to the board's meeting; :meth:`matchmake` asks hivemind's averager
    (``averager`` None: ``group_formation = "board_only"``, no matchmaking)."""

    def __init__(self, peer_id: str, cfg: AveragingConfig, exchange: Exchange, admission: Admission, averager,
                 client_mode: bool, view: Callable[[], BoardView], plan: Plan, rules: RoundRules,
                 stop: threading.Event, now: Callable[[], float] = DhtClock().now):
        self.peer_id, self.cfg, self.exchange, self.admission = peer_id, cfg, exchange, admission
        self.averager, self.client_mode, self.rules, self._stop = averager, client_mode, rules, stop
        self._view, self._plan, self._now = view, plan, now
        #: the last round whose meeting this peer went to, and how many meetings it held in it (each answered apart:
        #: meeting.Meeting.attempt). With matchmaking to fall back on a round holds one meeting; "board_only" meets
        #: again at every try
        self.met_round = -1
        self._meetings_held = 0
        self._news = Repeats(logger)

    def walk_ins(self, round_number: int) -> dict[str, PeerID]:
        """The peers that asked for this peer's meeting of ``round_number`` within the meeting's wait (id ->
        address): their view of the board made this peer their host (meet.hold_meeting takes them in)."""
        asked = self.exchange.askers(meeting_key(round_number), within_s=self.cfg.matchmaking_time)
        out = {}
        for peer in asked:
            try:  # libp2p authenticated these ids: a bad one is a bug, and costs only that walk-in
                out[peer] = peer_id_of(peer)
            except ValueError:
                continue
        return out

    def meet(self, launch: PendingRound, state_hash: str, hosting: Optional[Hosting] = None) -> Formation:
        """Form this round's group from the progress board (cotrain.averaging.groups): plan the groups of the peers
        at this round, and meet the others at the group's host (meet.hold_meeting: the host decides who goes).
        ``hosting``: the round's all-reduce rides with the meeting (this peer's contribution goes with its meeting;
        a host reduces the group's)."""
        view = self._view()
        planned = self._plan(view, board_time(view, self._now(), self.rules))
        self._meetings_held = self._meetings_held + 1 if self.met_round == launch.round else 1
        self.met_round = launch.round
        if planned is None and not self.client_mode and self.walk_ins(launch.round):
            planned = [self.peer_id], self.peer_id  # alone on our view, but peers came to us: host them
        if planned is None:
            return Formation(reason="no group of two on the board")
        members, host = planned
        mine = Meeting(launch.round, host_key(launch.round, host), launch.claimed, state_hash,
                       not self.client_mode, self.admission.credential(), attempt=self._meetings_held - 1,
                       swarm=launch.swarm, contributed=launch.contributed)
        others = [m for m in members if m != self.peer_id]
        try:
            peers = {m: peer_id_of(m) for m in others}
        except ValueError:  # the board's records were checked when read: a bug worth seeing
            logger.warning("round %d: a planned groupmate has no valid peer id; matchmaking instead", launch.round)
            return Formation(reason="a planned groupmate has no valid peer id")

        def admitted(peer: str, cred: bytes) -> bool:
            return self.admission.check(cred, peer, "a place in an averaging group").ok

        # the meeting waits up to matchmaking_time: these ask the view as it is when they are called, reads included
        # that came in since the group was planned
        def gone(peer: str) -> bool:  # it said on the board that it left (a node stopping after its last round)
            return any(p.peer_id == peer and p.phase == Phase.LEFT for p in self._view().peers)

        def follow(group: str) -> Optional[tuple[str, PeerID]]:  # the host a meeting names, if our view knows it
            there = next((p for p in self._view().peers
                          if p.reducer and host_key(launch.round, p.peer_id) == group), None)
            return None if there is None else (there.peer_id, peer_id_of(there.peer_id))

        def dialable(peer: str) -> bool:
            return not any(p.peer_id == peer and not p.reducer for p in self._view().peers)

        # the early meeting (this peer just took its H steps) waits for all its planned groupmates, or trains on
        # while round_decision waits for the slower ones; a later one (the round's wait is over, or a groupmate
        # already averages) goes with the planned peers that came and agree, two at least
        outcome = hold_meeting(self.exchange, self.peer_id, mine, host, peers, self.cfg.matchmaking_time,
                               self.cfg.request_timeout, admitted, self._stop, subset=not launch.early, gone=gone,
                               walk_ins=True, target=self.cfg.target_group_size, dialable=dialable,
                               follow=follow, payload=hosting.piece if hosting else b"",
                               reduce=hosting.reduce if hosting else None,
                               max_rest=hosting.max_rest if hosting else 0)
        if not outcome.ok:
            self._news.info(outcome.reason, "round %d: the board's group did not meet (%s)", launch.round,
                            outcome.reason)
            return Formation(reason=outcome.reason, disagreed=outcome.disagreed, went=True)
        info = {peer: dict(round=m.round, samples=m.samples, hash=m.hash, reducer=m.reducer, swarm=m.swarm,
                           contributed=m.contributed) for peer, m in outcome.meetings.items()}
        try:  # the host's roster may hold a peer our view had not shown (it went by the host's plan)
            group = sorted((peer_id_of(peer) for peer in outcome.meetings), key=str)
        except ValueError:
            return Formation(reason="the host listed a member with no valid peer id", went=True)
        return Formation(Formed(group, info, outcome.result, from_board=True), went=True)

    def matchmake(self, weight: float, launch: PendingRound, state_hash: str) -> Formation:
        """hivemind's matchmaking (it waits matchmaking_time for followers), of the peers at this round."""
        # hivemind reshuffles the group key after every group it assembles; ours must be this round's, every time
        self.averager.set_group_bits(round_group_bits(launch.round), wait=True)
        try:
            gathered = self.averager.step(
                weight=weight, gather=dict(round=launch.round, samples=launch.claimed, hash=state_hash,
                                           cred=self.admission.credential(), reducer=not self.client_mode,
                                           swarm=launch.swarm, contributed=launch.contributed),
                timeout=self.cfg.matchmaking_time * 2 + self.cfg.request_timeout, allow_retries=False)
        except Exception as e:  # noqa: BLE001 - hivemind raises many kinds here; each costs only this round
            return Formation(reason=f"matchmaking failed ({e!r})")
        if not gathered:
            return Formation(reason="no group formed")
        info = {str(k): v for k, v in gathered.items() if isinstance(v, dict)}
        group = sorted(admitted_group(gathered, info, self.peer_id, self.admission), key=str)
        info = {k: v for k, v in info.items() if k in {str(p) for p in group}}
        return Formation(Formed(group, info))


def admitted_group(gathered, info: dict, me: str, admission: Admission) -> list:
    """The members of a matchmaking group this peer averages with: itself and every groupmate whose credential
    (presented in the group's gathered metadata) admits the peer id hivemind's matchmaking authenticated. Every
    member applies the same check to the same metadata, so they agree on the group."""
    out = []
    for peer in gathered:
        name = str(peer)
        meta = info.get(name, {})
        cred = meta.get("cred") if isinstance(meta, dict) else None
        if name == me or admission.check(cred if isinstance(cred, bytes) else b"", name,
                                         "a place in an averaging group").ok:
            out.append(peer)
    return out
