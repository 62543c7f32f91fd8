"""``--step-record FILE``: one JSON line for every local step and every applied round, for tests and benches that
check what every node of a swarm applied (status.json keeps only the last step).

A step's line: ``{"round", "step", "samples_at", "lr"}``: the round its steps belong to, the local step's index in
it (0: the first), where it stood on the run's schedule and the inner lr it took. A round's line, written when the
node has applied it: ``{"round", "state", "outer_lr", "samples_total", "contributed", "resyncs", "time"}``: the round
it reached, the hash of its shared state, the outer step's lr it used (null for strategies without one), the swarm's
samples it holds, its own samples in the rounds it applied, how many times so far its state differed from its
group's and it downloaded theirs, and when (Unix time).
Off by default: a line a step is a write a step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional


class StepRecord:
    def __init__(self, path: Path):
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # a line at a time: readable while it runs
        self._round: Optional[int] = None

    def step(self, round_number: int, step: int, samples_at: float, lr: float) -> None:
        self._write(dict(round=round_number, step=step, samples_at=samples_at, lr=lr))

    def after_step(self, averaging) -> None:
        """A round's line when ``averaging`` (a RoundAverager) reached a round since the last call."""
        if self._round is None:
            self._round = averaging.round
        if averaging.round != self._round:
            self._round = averaging.round
            self._write(dict(round=averaging.round, state=averaging.state.hash, outer_lr=averaging.outer_lr(),
                             samples_total=averaging.tally.samples_total, contributed=averaging.tally.contributed,
                             resyncs=averaging.stats.resyncs, time=time.time()))

    def _write(self, line: dict) -> None:
        self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._file.close()
