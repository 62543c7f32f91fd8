"""What the operator's fleet asks of Ray (cotrain.coordinator.fleet.ray_resources): whole CPUs for a local Ray
instance, shares in Ray's 1/10000 steps for the managed nodes, and a refusal in words (naming the flags and the
figures) when the nodes cannot fit; and `cotrain coordinator start` refusing such flags with exit code 3."""

import math
import subprocess
import sys
from fractions import Fraction

import pytest

from cotrain.coordinator.fleet import EVAL_TASK_CPUS, RAY_RESOURCE_UNITS, ray_resources, ray_share
from cotrain.exit_codes import ExitCode


def exact_units(share: float) -> Fraction:
    """``share`` rounded down to Ray's units, in exact arithmetic (what ray_resources must get without float error)."""
    return Fraction(math.floor(Fraction(str(share)) * RAY_RESOURCE_UNITS), RAY_RESOURCE_UNITS)


@pytest.mark.parametrize("machine_cpus", [1, 2, 16])
@pytest.mark.parametrize("share", [0.5, 0.67, 1.5, 2 / 3, 0.666667])
@pytest.mark.parametrize("nodes", [1, 2, 3, 5, 7, 8])
def test_a_local_instance_gets_whole_cpus_that_hold_every_share(nodes, share, machine_cpus):
    r = ray_resources(nodes, share, machine_cpus)
    if share > machine_cpus:
        assert r.refusal is not None and "--managed-node-cpus" in r.refusal
        return
    assert r.refusal is None
    assert isinstance(r.num_cpus, int) and not isinstance(r.num_cpus, bool)
    # the share: what was asked, rounded down to Ray's 1/10000 (Ray refuses finer ones)
    assert Fraction(str(r.share)) == exact_units(share)
    assert (Fraction(str(r.share)) * RAY_RESOURCE_UNITS).denominator == 1
    assert share - 1 / RAY_RESOURCE_UNITS < r.share <= share
    # the nodes and an evaluation task fit, on no fewer CPUs than the machine has, and not one CPU more than that
    nodes_cpus = nodes * exact_units(share)
    assert Fraction(str(r.nodes_cpus)) == nodes_cpus
    assert r.num_cpus >= nodes_cpus + EVAL_TASK_CPUS and r.num_cpus >= machine_cpus
    assert r.num_cpus == max(machine_cpus, math.ceil(nodes_cpus) + EVAL_TASK_CPUS)


def test_float_error_adds_no_cpu():
    # 3 nodes on 2 CPUs: 2/3 each, 0.666667 as simulate passes it; 0.6666 x 3 = 1.9998 fits 2 CPUs, + 1 evaluating
    assert ray_resources(3, 2 / 3, 2).num_cpus == 3
    assert ray_resources(3, 0.666667, 2).num_cpus == 3
    # 3 x 0.67 is 2.0100000000000002 in floats and 2.01 CPUs in fact: 3 CPUs for the nodes, not 4, + 1
    assert ray_resources(3, 0.67, 2).num_cpus == 4
    # 0.29 x 10000 is 2899.9999999999995: still 0.29, and 100 of them 29 CPUs
    assert ray_resources(100, 0.29, 2).share == 0.29 and ray_resources(100, 0.29, 2).num_cpus == 30
    assert ray_resources(10, 0.1, 2).num_cpus == 2  # 1.0 CPU, + 1: the machine's 2
    assert ray_share(0.00019) == 0.0001 and ray_share(1.5) == 1.5


def test_a_share_larger_than_this_machine_is_refused_naming_the_flag():
    r = ray_resources(2, 3, 2)
    assert r.refusal is not None
    assert "--managed-node-cpus 3" in r.refusal and "2 CPU(s) of this machine" in r.refusal and "--ray-address" in \
        r.refusal
    assert ray_resources(2, 2, 2).refusal is None  # a share of the whole machine runs


def test_a_share_finer_than_ray_counts_is_refused():
    r = ray_resources(1, 0.00001, 2)
    assert r.refusal is not None and "--managed-node-cpus" in r.refusal and "0.0001" in r.refusal


@pytest.mark.parametrize("nodes, share, cluster, largest, fits", [
    (3, 0.5, 4.0, 2.0, True),
    (8, 0.5, 4.0, 2.0, True),
    (7, 0.67, 8.0, 4.0, True),
    (3, 1.5, 4.0, 2.0, False),  # 4.5 CPUs on 4
    (5, 1.5, 8.0, 4.0, True),  # 7.5 of 8
    (6, 1.5, 8.0, 4.0, False),
    (1, 8.0, 16.0, 4.0, False),  # fits the cluster, not one of its machines
])
def test_a_cluster_must_hold_the_nodes(nodes, share, cluster, largest, fits):
    r = ray_resources(nodes, share, 2, cluster_cpus=cluster, largest_machine_cpus=largest,
                      where="the Ray cluster at --ray-address ray://head:10001")
    assert isinstance(r.num_cpus, int) and r.num_cpus == int(cluster)
    assert (r.refusal is None) == fits, r.refusal
    if fits:
        assert r.nodes_cpus <= cluster
    else:
        assert "--managed-node-cpus" in r.refusal and "--ray-address ray://head:10001" in r.refusal
        figure = f"{largest:g} CPUs" if nodes * share <= cluster else f"{nodes * share:g} CPUs"
        assert figure in r.refusal, r.refusal


def test_a_cluster_the_nodes_fill_warns_that_evaluations_wait():
    r = ray_resources(4, 1.0, 2, cluster_cpus=4.0, largest_machine_cpus=2.0)
    assert r.refusal is None and r.warning is not None and "evaluation" in r.warning
    assert ray_resources(3, 1.0, 2, cluster_cpus=4.0, largest_machine_cpus=2.0).warning is None


def test_coordinator_start_refuses_a_share_larger_than_the_machine(tmp_path):
    """Exit code 3 (config), one line naming the flag and the figures, before anything starts (no state dir, no Ray)."""
    import os

    too_many = (os.cpu_count() or 1) + 1
    out = subprocess.run([sys.executable, "-m", "cotrain.cli", "coordinator", "start", "--insecure", "--listen",
                          "127.0.0.1:0", "--state-dir", str(tmp_path / "s"), "--managed-nodes", "2",
                          "--managed-node-cpus", str(too_many)], capture_output=True, text=True, timeout=120)
    assert out.returncode == ExitCode.CONFIG, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("cotrain: ")]
    assert len(errors) == 1, out.stderr
    assert f"--managed-node-cpus {too_many}" in errors[0] and f"{too_many - 1} CPU(s)" in errors[0]
    assert not (tmp_path / "s").exists()
