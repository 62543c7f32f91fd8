"""The run's lr schedule: a pure function of the swarm's samples, and the configs it refuses."""

import math
import subprocess
import sys

import pytest

from cotrain.config import ConfigError, RunConfig
from cotrain.exit_codes import ExitCode
from cotrain.optim.schedule import Schedule, lr_factor


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


def test_the_lr_is_a_function_of_the_swarms_samples_not_of_who_asks():
    """A node that joins at round 500 computes from the samples in the state it downloaded: the same lr as the
    veterans at that round, however many steps it took itself (none)."""
    cfg = RunConfig()
    veteran = lr_factor(Schedule.from_config(cfg), 500 * 2 * 40 * 16)
    joiner = lr_factor(Schedule.from_config(RunConfig.from_toml(cfg.to_toml())), 500 * 2 * 40 * 16)
    assert veteran == joiner < 1.0


def test_the_default_schedule_decays_without_a_horizon():
    s = Schedule.from_config(RunConfig())
    assert s.horizon_samples == 0
    assert lr_factor(s, 10**6) < lr_factor(s, 10**5) < lr_factor(s, s.warmup_samples)
    assert not s.problems()


def test_the_floor_follows_min_lr_and_one_above_lr_is_the_peak():
    assert Schedule.from_config(RunConfig()).min_ratio == pytest.approx(0.1)
    cfg = RunConfig.from_toml("[optimizer]\nlr = 1e-4\nmin_lr = 3e-4\n")
    assert Schedule.from_config(cfg).min_ratio == 1.0


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
