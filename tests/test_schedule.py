"""The run's lr schedule: a pure function of the swarm's samples, and the configs it refuses."""

import math
import subprocess
import sys

import pytest

from cotrain.config import ConfigError, RunConfig
from cotrain.exit_codes import ExitCode
from cotrain.optim.schedule import RoundClock, Schedule, lr_factor


def test_warmup_rises_linearly_from_a_hundredth_to_the_peak():
    s = Schedule("constant", warmup_samples=1000)
    assert lr_factor(s, 0) == pytest.approx(0.01)
    assert lr_factor(s, 500) == pytest.approx(0.01 + 0.99 * 0.5)
    assert lr_factor(s, 1000) == 1.0
    assert lr_factor(s, 10**9) == 1.0


def test_cosine_falls_from_the_peak_to_the_floor_at_the_horizon_and_stays():
    s = Schedule("cosine", horizon_samples=11_000, warmup_samples=1000, min_ratio=0.1)
    assert lr_factor(s, 1000) == pytest.approx(1.0)
    assert lr_factor(s, 6000) == pytest.approx(0.55)  # half way: the mean of peak and floor
    assert lr_factor(s, 11_000) == pytest.approx(0.1)
    assert lr_factor(s, 50_000) == pytest.approx(0.1)
    values = [lr_factor(s, x) for x in range(1000, 11_000, 250)]
    assert values == sorted(values, reverse=True)


def test_wsd_holds_the_peak_then_cools_down_over_the_last_fraction():
    s = Schedule("wsd", horizon_samples=10_000, warmup_samples=100, cooldown_fraction=0.2, min_ratio=0.0)
    assert lr_factor(s, 7_999) == 1.0
    assert lr_factor(s, 9_000) == pytest.approx(0.5)
    assert lr_factor(s, 10_000) == pytest.approx(0.0)


def test_inverse_sqrt_needs_no_horizon_and_never_goes_below_the_floor():
    s = Schedule("inverse_sqrt", timescale_samples=1000, min_ratio=0.1)
    assert lr_factor(s, 500) == 1.0
    assert lr_factor(s, 4000) == pytest.approx(0.5)
    assert lr_factor(s, 10**12) == pytest.approx(0.1)


@pytest.mark.parametrize("clock, step, samples", [
    (RoundClock(base=0, last_round=0, inner_steps=10, first_step=16), 0, 0),  # a new run: a node's pace
    (RoundClock(base=0, last_round=0, inner_steps=10, first_step=16), 5, 80),
    (RoundClock(base=1000, last_round=480, inner_steps=10, first_step=16), 0, 1000),  # the round before's pace
    (RoundClock(base=1000, last_round=480, inner_steps=10, first_step=16), 10, 1480),  # H steps: one such round on
    (RoundClock(base=1000, last_round=480, inner_steps=10, first_step=16), 25, 2200),  # a fast node goes on along it
    (RoundClock(base=1000, last_round=480, inner_steps=10, first_step=16), -3, 1000),
])
def test_a_rounds_clock_stands_at_its_base_plus_the_round_befores_pace(clock, step, samples):
    assert clock.samples_at(step) == pytest.approx(samples)


def test_the_lr_of_a_local_step_depends_on_what_the_round_agrees_on_not_on_who_asks():
    """Two members of a round hold the same shared state (count and the round before's samples); they ran at
    different speeds, joined at different times, trained different batches: step k takes the same lr on both."""
    schedule = Schedule("inverse_sqrt", warmup_samples=100, timescale_samples=200)
    veteran = RoundClock(base=5000, last_round=960, inner_steps=20, first_step=16)
    joiner = RoundClock(base=5000, last_round=960, inner_steps=20, first_step=64)  # another batch: never read
    lrs = [lr_factor(schedule, veteran.samples_at(k)) for k in range(40)]
    assert lrs == [lr_factor(schedule, joiner.samples_at(k)) for k in range(40)]
    assert lrs == sorted(lrs, reverse=True) and lrs[0] > lrs[-1]  # and it moves within the round
    # a state from another round is another clock: the test could fail
    assert lr_factor(schedule, RoundClock(6000, 960, 20).samples_at(0)) < lrs[0]


def test_the_default_schedule_decays_without_a_horizon():
    s = Schedule.from_config(RunConfig())
    assert s.horizon_samples == 0
    assert lr_factor(s, 10**6) < lr_factor(s, 10**5) < lr_factor(s, s.warmup_samples)
    assert not s.problems()


def test_the_floor_follows_min_lr():
    assert Schedule.from_config(RunConfig()).min_ratio == pytest.approx(0.1)
    assert Schedule.from_config(RunConfig.from_toml("[optimizer]\nlr = 1e-3\nmin_lr = 1e-3\n")).min_ratio == 1.0


@pytest.mark.parametrize("text, field", [
    ("[schedule]\nkind = 'cosine'\n", "schedule.horizon_samples"),
    ("[schedule]\nkind = 'cosine'\nhorizon_samples = 0\n", "schedule.horizon_samples"),
    ("[schedule]\nhorizon_samples = -5\n", "schedule.horizon_samples"),
    ("[schedule]\nkind = 'cosine'\nhorizon_samples = 1000\nwarmup_samples = 2000\n", "schedule.warmup_samples"),
    ("[schedule]\nkind = 'wsd'\nhorizon_samples = 1000\nwarmup_samples = 900\n", "schedule.warmup_samples"),
    ("[schedule]\nkind = 'wsd'\n", "schedule.horizon_samples"),
    ("[schedule]\nwarmup_samples = -1\n", "schedule.warmup_samples"),
    ("[schedule]\nkind = 'linear'\n", "schedule.kind"),
    ("[optimizer]\nlr = -0.001\n", "optimizer.lr"),
    ("[optimizer]\nmin_lr = -0.001\n", "optimizer.min_lr"),
    ("[optimizer]\nlr = 1e-4\nmin_lr = 3e-4\n", "optimizer.min_lr"),
    ("[schedule]\nkind = 'inverse_sqrt'\nwarmup_samples = 2048\ntimescale_samples = 1000\n",
     "schedule.timescale_samples"),
    ("[schedule]\nkind = 'inverse_sqrt'\nhorizon_samples = 100000\n", "schedule.horizon_samples"),
    ("[schedule]\nkind = 'constant'\nhorizon_samples = 100000\n", "schedule.horizon_samples"),
    ("[schedule]\nouter = true\n[averaging]\nstrategy = 'sync'\n", "schedule.outer"),
])
def test_a_schedule_that_makes_no_sense_is_refused_naming_the_field(text, field):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_toml(text)
    assert field in str(err.value)
    assert "Traceback" not in str(err.value)


def test_coordinator_start_refuses_a_warmup_longer_than_the_horizon_before_any_node_joins(tmp_path):
    bad = tmp_path / "run.toml"
    bad.write_text("[schedule]\nkind = 'cosine'\nhorizon_samples = 1000\nwarmup_samples = 5000\n")
    result = subprocess.run([sys.executable, "-m", "cotrain.cli", "coordinator", "start", "--insecure", "--config",
                             str(bad), "--state-dir", str(tmp_path / "state")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == ExitCode.CONFIG, result.stderr
    assert "schedule.warmup_samples" in result.stderr
    assert "Traceback" not in result.stderr


def test_factors_are_finite_and_within_the_floor_and_the_peak():
    for kind in ("constant", "cosine", "wsd", "inverse_sqrt"):
        s = Schedule(kind, horizon_samples=5000, warmup_samples=100, timescale_samples=300, min_ratio=0.2)
        for x in (0, 1, 99, 100, 101, 2500, 4999, 5000, 10**9, -3):
            f = lr_factor(s, x)
            assert math.isfinite(f) and 0.0 < f <= 1.0
            if x >= 100:
                assert f >= 0.2 - 1e-12
