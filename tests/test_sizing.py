"""A fleet too big for its machine's memory is refused before anything starts (cotrain.sizing), with figures that
bench/footprint.py measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cotrain.config import RunConfig
from cotrain.exit_codes import ExitCode
from cotrain.sizing import (FleetTooLarge, available_bytes, check_fleet, coordinator_bytes, fleet_bytes, fleet_refusal,
                            node_bytes)

COTRAIN = str(Path(sys.executable).with_name("cotrain"))
MEASURED = Path(__file__).resolve().parents[1] / "docs" / "results" / "footprint.json"
GB = 2**30


def test_the_constants_are_the_benchs_figures_within_a_quarter():
    """bench/footprint.py's output is kept in docs/results/footprint.json; a node grown or shrunk by more than 25%
    since must be measured again and its constants updated."""
    measured = json.loads(MEASURED.read_text())
    assert len(measured["rows"]) >= 2
    for row in measured["rows"]:  # the estimates against what a node and the coordinator of each width took
        assert abs(node_bytes(row["params"]) - row["node_pss_bytes"]) <= 0.25 * row["node_pss_bytes"], row
        assert abs(coordinator_bytes(row["params"]) - row["coordinator_pss_bytes"]) <= \
            0.25 * row["coordinator_pss_bytes"], row


def test_a_fleet_that_fits_is_not_refused_and_one_that_does_not_is_refused_with_its_figures():
    params = 1_000_000
    need = fleet_bytes(8, params)
    assert fleet_refusal("--nodes", 8, params, available=need) is None
    text = fleet_refusal("--nodes", 8, params, available=need - 1)
    assert text.startswith("--nodes 8: ") and "at most 7 fit" in text and "--force" in text
    assert f"{params:,} parameters" in text
    assert "at most 0 fit" in fleet_refusal("--managed-nodes", 2, params, available=1)
    assert fleet_refusal("--nodes", 2, params, available=2 * node_bytes(params), coordinator=False) is None


def test_check_fleet_counts_the_run_configs_model_and_force_skips_it():
    cfg = RunConfig()
    with pytest.raises(FleetTooLarge, match="--nodes 10000"):
        check_fleet("--nodes", 10_000, cfg, available=24 * GB)
    check_fleet("--nodes", 10_000, cfg, force=True, available=24 * GB)
    check_fleet("--nodes", 3, cfg, available=24 * GB)
    check_fleet("--nodes", 10_000, cfg, available=0)  # memory unknown: no check
    bigger = cfg.with_overrides(model={"hidden_size": 2048, "num_layers": 3})
    with pytest.raises(FleetTooLarge):  # the same count, a model 60x larger
        check_fleet("--nodes", 16, bigger, available=16 * node_bytes(0) + coordinator_bytes(0))


def test_available_memory_is_the_kernels_or_the_cgroups_limit(tmp_path):
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n")
    (proc / "self" / "cgroup").write_text("0::/box\n")
    assert available_bytes(proc, cgroup) == 20_000_000 * 1024
    (cgroup / "box").mkdir(parents=True)
    (cgroup / "box" / "memory.max").write_text("max\n")
    assert available_bytes(proc, cgroup) == 20_000_000 * 1024
    (cgroup / "box" / "memory.max").write_text(f"{4 * GB}\n")
    (cgroup / "box" / "memory.current").write_text(f"{GB}\n")
    assert available_bytes(proc, cgroup) == 3 * GB
    assert available_bytes(tmp_path / "nowhere", cgroup) == 0


@pytest.mark.parametrize("command", [
    ["simulate", "--nodes", "10000", "--duration", "5"],
    ["demo", "--nodes", "10000", "--duration", "5"],
])
def test_a_launcher_refuses_a_fleet_that_cannot_fit_before_it_starts_anything(tmp_path, command):
    work = tmp_path / "work"
    out = subprocess.run([COTRAIN, *command, "--workdir", str(work)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == ExitCode.CONFIG, out.stderr[-3000:]
    assert "--nodes 10000: the nodes need about" in out.stderr and "at most" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not work.exists()  # nothing was started, nor its folder made


def test_coordinator_start_refuses_managed_nodes_that_cannot_fit_a_local_ray_instance(tmp_path):
    out = subprocess.run([COTRAIN, "coordinator", "start", "--insecure", "--managed-nodes", "10000",
                          "--managed-node-cpus", "0.01", "--state-dir", str(tmp_path / "state")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == ExitCode.CONFIG, out.stderr[-3000:]
    assert "--managed-nodes 10000: the nodes need about" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
