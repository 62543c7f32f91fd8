"""Where a peer stands in its rounds: its round, the local steps and samples of it so far, and the times that the
scheduler's decisions read (cotrain.averaging.scheduler.RoundFacts).

:class:`Position` belongs to the front (:class:`~cotrain.averaging.rounds.RoundAverager`), which changes it on the
node's main thread only; the board publisher's thread reads it through :meth:`progress` (each field one reference:
a record may mix two steps' counters, never a torn value).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from cotrain.averaging.overlap import PendingRound
from cotrain.averaging.progress import PeerProgress, Phase
from cotrain.optim.schedule import RoundClock


@dataclass
class Position:
    round: int = 0
    #: the swarm's time this peer came to its round (published as PeerProgress.since: a sharded board's groups are
    #: cut in the order the peers came)
    since: float = 0.0
    steps: int = 0  # local steps taken in this round
    samples: int = 0  # the samples they trained on
    #: it joined (or resynchronised) after this round began: its peers do not wait for it
    mid_round: bool = False
    #: when it took the round's H-th step (None: not yet)
    reached_h_at: Optional[float] = None
    #: where this round's steps stand on the run's schedule (set when they begin)
    clock: RoundClock = field(default_factory=RoundClock)
    #: a round failed: no new try before this time
    retry_at: float = 0.0
    #: a round failed because a groupmate planned another group: the next try waits for a board read begun after
    #: this time (see board_view.awaiting_read)
    reread_after: float = 0.0
    #: (round, its group: every member, this peer included) of the last round this peer's group met at on the
    #: board: the plan of the next round within averaging.group_rounds (see scheduler.kept_group_of)
    kept: Optional[tuple[int, list[str]]] = None

    def begin(self, clock: RoundClock, mid_round: bool) -> None:
        """The round's local steps begin (afresh, or after a downloaded state: ``mid_round``)."""
        self.clock, self.steps, self.samples, self.mid_round, self.reached_h_at = clock, 0, 0, mid_round, None

    def step(self, samples: int, now: float, inner_steps: int) -> bool:
        """Count a local step of ``samples``; True when it is the round's H-th."""
        self.steps += 1
        self.samples += samples
        if self.steps >= inner_steps and self.reached_h_at is None:
            self.reached_h_at = now
            return True
        return False

    def enter(self, round_number: int, now: float) -> None:
        """This peer is at ``round_number`` from ``now`` (a round applied, or a state taken)."""
        self.round, self.since = round_number, now

    def take_back(self, launch: PendingRound) -> None:
        """A round launched in the background did not happen: its steps count in this round again."""
        self.steps, self.samples, self.reached_h_at = launch.give_back(self.steps, self.samples, self.reached_h_at)

    def progress(self, peer_id: str, phase: Phase, now: float, *, reducer: bool, contributed: int) -> PeerProgress:
        """This peer's record on the progress board."""
        return PeerProgress(peer_id, self.round, self.steps, self.samples, phase, self.mid_round, now,
                            reducer=reducer, since=self.since, contributed=contributed)
