"""The dashboard's learning curve: evaluations carry the swarm's samples and the schedule's lr (the checkpointer), the
history JSON hands them on (``history_view``), and the page draws them first; no swarm is started here."""

import math
import re
from pathlib import Path

import pytest

from cotrain.coordinator.store import EvalRow, Store
from cotrain.coordinator.web import history_view
from cotrain.optim.schedule import Schedule, lr_factor

from tiny_swarm import tiny_config


def test_history_view_hands_on_samples_and_lr_of_each_evaluation():
    evals = [EvalRow(100.0, 1, 2.9, float("nan"), {"val_loss": 2.9, "val_bpc": float("nan")}),  # stored before
             EvalRow(110.0, 3, 2.5, 3.6, {"val_loss": 2.5, "val_bpc": 3.6, "samples_total": 4096, "lr": 0.003}),
             EvalRow(120.0, 5, float("nan"), float("inf"), {"samples_total": 8192.0, "lr": float("nan")})]
    view = history_view([], evals, {})
    assert view["evals"] == [
        {"t": 100.0, "round": 1, "val_loss": 2.9, "val_bpc": None, "samples": None, "lr": None},
        {"t": 110.0, "round": 3, "val_loss": 2.5, "val_bpc": 3.6, "samples": 4096, "lr": 0.003},
        # NaN and inf are not JSON: the page would not parse them
        {"t": 120.0, "round": 5, "val_loss": None, "val_bpc": None, "samples": 8192, "lr": None}]
    assert isinstance(view["evals"][2]["samples"], int)
    assert history_view([], [], {}) == {"points": [], "buckets": [], "names": {}, "leaderboard": [], "evals": []}


class Evaluations:
    """An evaluator whose results come back when the test says (as a Ray task's do)."""

    def __init__(self):
        self.finished = []

    def collect(self):
        out, self.finished = self.finished, []
        return out


@pytest.fixture
def checkpointer(tmp_path):
    from cotrain.coordinator.checkpointer import Checkpointer
    from cotrain.coordinator.service import SwarmSummary

    cfg = tiny_config(tmp_path / "corpus.txt", optimizer={"lr": 0.01, "min_lr": 0.001},
                      schedule={"kind": "inverse_sqrt", "warmup_samples": 100, "timescale_samples": 1000})
    return Checkpointer(cfg, "run", None, None, None, Store(tmp_path / "state"), SwarmSummary(), Evaluations())


def test_an_evaluation_is_recorded_at_its_checkpoints_samples_with_the_lr_there(checkpointer):
    lr = lambda samples: 0.01 * lr_factor(Schedule.from_config(checkpointer.cfg), samples)  # noqa: E731
    assert lr(4000) == pytest.approx(0.005)  # the run's schedule, not a constant
    for round_number, samples in ((2, 1000), (4, 4000), (6, 9000)):
        checkpointer._remember_samples(round_number, samples)
    # Ray tasks finish out of order, ticks after their checkpoints
    checkpointer.evaluator.finished = [(4, {"val_loss": 2.0, "val_bpc": 2.9}), (2, {"val_loss": 2.2, "val_bpc": 3.1})]
    for round_number, metrics in checkpointer.evaluator.collect():  # as tick() records them
        checkpointer._record_eval(round_number, metrics)
    stored = {e.round: e.metrics for e in checkpointer.store.evals()}
    assert stored[4] == {"val_loss": 2.0, "val_bpc": 2.9, "samples_total": 4000, "lr": pytest.approx(lr(4000))}
    assert stored[2] == {"val_loss": 2.2, "val_bpc": 3.1, "samples_total": 1000, "lr": pytest.approx(lr(1000))}
    assert checkpointer.summary.val_round == 4 and checkpointer.summary.val_metrics["samples_total"] == 4000
    assert set(checkpointer.samples_at) == {6}  # recorded rounds are forgotten; round 6's evaluation is to come
    view = history_view([], checkpointer.store.evals(), {})
    assert [(e["round"], e["samples"]) for e in view["evals"]] == [(4, 4000), (2, 1000)]
    assert view["evals"][0]["lr"] == pytest.approx(0.005)


def test_samples_of_an_evaluation_come_from_the_store_when_not_remembered(checkpointer):
    checkpointer.store.add_checkpoint(8, "round-000008.safetensors", "0" * 64, 20000)
    checkpointer._record_eval(8, {"val_loss": 1.5, "val_bpc": 2.0})
    checkpointer._record_eval(9, {"val_loss": 1.4, "val_bpc": 1.9})  # no checkpoint row left: no samples, no lr
    first, second = checkpointer.store.evals()
    assert first.metrics["samples_total"] == 20000 and first.metrics["lr"] == pytest.approx(0.01 * math.sqrt(0.05))
    assert second.metrics == {"val_loss": 1.4, "val_bpc": 1.9}
    assert [e["samples"] for e in history_view([], checkpointer.store.evals(), {})["evals"]] == [20000, None]


def test_only_the_newest_checkpoints_samples_are_kept(checkpointer):
    from cotrain.coordinator.checkpointer import SAMPLES_KEPT

    for round_number in range(1, SAMPLES_KEPT + 11):
        checkpointer._remember_samples(round_number, 100 * round_number)
    assert sorted(checkpointer.samples_at) == list(range(11, SAMPLES_KEPT + 11))


def test_the_learning_curve_is_the_first_chart_and_every_chart_can_say_it_has_no_data():
    page = (Path(__file__).resolve().parents[1] / "coordinator" / "dashboard.html").read_text()
    charts = re.findall(r'<div id="(\w+)" class="chart">', page)
    assert charts == ["curve", "loss", "val", "online", "throughput", "bytes"]
    drawn = re.findall(r'(?:chart|Plotly\.react)\("(\w+)"', page)
    assert sorted(drawn) == sorted(charts) and "Plotly.react(\"" not in page  # each through chart(): no empty axis
    assert "no data yet" in page
