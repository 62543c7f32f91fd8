import subprocess
import sys

import pytest

from cotrain.config import ConfigError, RunConfig
from cotrain.exit_codes import ExitCode


def test_defaults_round_trip_through_toml():
    cfg = RunConfig()
    assert RunConfig.from_toml(cfg.to_toml()) == cfg


@pytest.mark.parametrize("text, field", [
    ("[model]\nhidden_size = -1\n", "model.hidden_size"),
    ("[model]\nkind = 'transformer'\n", "model.kind"),
    ("[data]\nseq_len = 'long'\n", "data.seq_len"),
    ("[averaging]\nouter_lr = 0\n", "averaging.outer_lr"),
    ("[modle]\nkind = 'lstm'\n", "modle"),
    ("[model]\nhiden_size = 3\n", "model.hiden_size"),
    ("[averaging]\nmatchmaking_time = 1.0\nrequest_timeout = 2.0\n", "request_timeout"),
    ("[coordinator]\ncredential_ttl_s = 600\nforget_after_s = 300\n", "forget_after_s"),
])
def test_bad_field_is_named(text, field):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_toml(text)
    assert field in str(err.value)


def test_not_toml_is_a_clear_error():
    with pytest.raises(ConfigError, match="not valid TOML"):
        RunConfig.from_toml("[model\n")


def test_cli_reports_bad_config_without_traceback(tmp_path):
    bad = tmp_path / "run.toml"
    bad.write_text("[optimizer]\nlr = -3\n")
    result = subprocess.run([sys.executable, "-m", "cotrain.cli", "coordinator", "start", "--insecure", "--config",
                             str(bad), "--state-dir", str(tmp_path / "state")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == ExitCode.CONFIG, result.stderr  # handled: an unhandled exception exits 1
    assert "optimizer.lr" in result.stderr  # the CONFIG exit code promises a message naming the field


def test_cli_requires_tls_or_insecure(tmp_path):
    result = subprocess.run([sys.executable, "-m", "cotrain.cli", "coordinator", "start", "--state-dir",
                             str(tmp_path / "state")], capture_output=True, text=True, timeout=120)
    assert result.returncode == ExitCode.USAGE, result.stderr  # handled: an unhandled exception exits 1
    assert "--insecure" in result.stderr
