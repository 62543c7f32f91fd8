"""A volunteer's limits: sizes, the upload cap on a real loopback exchange, idle detection, the node config file."""

import argparse
import time

import pytest

from cotrain.averaging import Admission, Exchange, UploadLimiter, start_dht
from cotrain.node.cli import resolve_options
from cotrain.cli.launch import cpu_shares
from cotrain.node.limits import (IdleMonitor, choose_cpus, lower_thread_priority, cpu_quota, format_cpu_list, parse_cpu_list, parse_size,
                                 read_cpu_max, torch_threads)

FREED_THEN_RELEASED = """
import json
from cotrain.memory import release_freed_memory

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

blocks = [bytes(4096) for _ in range(20000)]  # 80 MB in malloc'd blocks (above pymalloc's 512 bytes)
pin = bytes(4096)  # allocated after them: the heap's top stays in use, so malloc cannot trim it by itself
before_free = resident()
del blocks
freed = resident()
released = release_freed_memory()
print(json.dumps(dict(before_free=before_free, freed=freed, after=resident(), released=released)))
"""


@pytest.mark.parametrize("text, expected", [("4G", 4 * 2**30), ("512M", 512 * 2**20), ("1.5GiB", int(1.5 * 2**30)),
                                            ("1000", 1000), ("64k", 65536)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_parse_size_names_the_flag():
    with pytest.raises(ValueError, match="--max-memory"):
        parse_size("lots")


@pytest.mark.parametrize("text, cpus", [("0,1", (0, 1)), ("0-3", (0, 1, 2, 3)), ("4, 0-1,1", (0, 1, 4)),
                                        ("7", (7,))])
def test_cpu_lists_read_as_taskset_writes_them(text, cpus):
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@pytest.mark.parametrize("text", ["", "a", "3-1", "0,,1", "-1", "1-"])
def test_a_bad_cpu_list_names_the_flag(text):
    with pytest.raises(ValueError, match="--cpus"):
        parse_cpu_list(text)


def test_chosen_cpus_are_the_named_ones_then_the_first_max_cpus_of_them():
    allowed = {0, 1, 2, 3, 4, 5}
    assert choose_cpus(allowed) == [0, 1, 2, 3, 4, 5]
    assert choose_cpus(allowed, max_cpus=2) == [0, 1]
    assert choose_cpus(allowed, cpus=(4, 2, 5)) == [2, 4, 5]
    assert choose_cpus(allowed, cpus=(4, 2, 5), max_cpus=2) == [2, 4]
    with pytest.raises(ValueError, match="--cpus: CPU 6-7 "):
        choose_cpus(allowed, cpus=(1, 6, 7))


@pytest.mark.parametrize("text, cpus", [("max 100000", None), ("200000 100000", 2.0), ("150000 100000\n", 1.5),
                                        ("50000", 0.5), (None, None), ("", None), ("garbage here", None)])
def test_cgroup_quota(text, cpus):
    assert cpu_quota(text) == cpus


def test_threads_follow_the_cpus_a_node_may_use_not_the_machines_cores():
    # torch's default would be the machine's core count whatever the affinity: 64 here
    assert torch_threads({0, 1}, None)[0] == 2
    assert torch_threads(range(64), "max 100000")[0] == 64
    threads, why = torch_threads(range(64), "200000 100000")  # a container limited to 2 CPUs on a 64-core host
    assert threads == 2 and "quota" in why
    assert torch_threads(range(64), "150000 100000")[0] == 2  # 1.5 CPUs: rounded up
    assert torch_threads(range(64), "10000 100000")[0] == 1
    assert torch_threads({3}, "400000 100000")[0] == 1  # a quota above the affinity changes nothing


def test_explicit_threads_win_but_not_beyond_the_cpus_pinned_to():
    assert torch_threads(range(8), None, threads=3) == (3, "--threads 3")
    assert torch_threads(range(2), None, threads=4)[0] == 4  # not pinned: as asked
    assert torch_threads(range(2), None, threads=4, pinned=True)[0] == 2
    assert torch_threads(range(8), "100000 100000", threads=3)[0] == 3


def test_cgroup_quota_is_read_from_v2_or_v1_files(tmp_path):
    proc = tmp_path / "cgroup"
    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "cpu.max").write_text("max 100000\n")
    (v2 / "job" / "cpu.max").write_text("300000 100000\n")
    proc.write_text("0::/job\n")
    assert cpu_quota(read_cpu_max(v2, proc)) == 3.0
    (v2 / "cpu.max").write_text("100000 100000\n")  # the container's own limit is tighter
    assert cpu_quota(read_cpu_max(v2, proc)) == 1.0
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("2:cpu,cpuacct:/\n0::/\n")
    assert read_cpu_max(v1, proc) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("250000\n")
    assert cpu_quota(read_cpu_max(v1, proc)) == 2.5
    assert read_cpu_max(tmp_path / "none", tmp_path / "missing") is None


def _cpus_of(share):
    return set(parse_cpu_list(share[share.index("--cpus") + 1])) if "--cpus" in share else None


def _threads_of(share):
    return int(share[share.index("--threads") + 1])


@pytest.mark.parametrize("nodes, cpus", [(2, 2), (3, 4), (4, 4), (3, 8), (2, 7)])
def test_nodes_on_one_machine_get_disjoint_cpus_covering_it(nodes, cpus):
    allowed = list(range(10, 10 + cpus))  # not starting at 0: a process already pinned
    shares = cpu_shares(nodes, allowed, "max 100000")
    assert len(shares) == nodes
    pinned = [_cpus_of(s) for s in shares]
    assert all(p for p in pinned)
    assert set().union(*pinned) == set(allowed) and sum(len(p) for p in pinned) == cpus  # disjoint, all used
    assert [_threads_of(s) for s in shares] == [len(p) for p in pinned]
    assert max(map(len, pinned)) - min(map(len, pinned)) <= 1


def test_unpinned_shares_have_the_same_threads_without_cpus():
    pinned, unpinned = cpu_shares(2, [0, 1, 2, 3], None), cpu_shares(2, [0, 1, 2, 3], None, pin=False)
    assert [_cpus_of(s) for s in unpinned] == [None, None]
    assert [_threads_of(s) for s in unpinned] == [_threads_of(s) for s in pinned] == [2, 2]


def test_more_nodes_than_cpus_take_one_thread_each_unpinned():
    shares = cpu_shares(3, [0, 1], None)
    assert all(_cpus_of(s) is None and _threads_of(s) == 1 for s in shares)


def test_nodes_under_a_quota_divide_the_quota():
    shares = cpu_shares(2, list(range(64)), "400000 100000")
    assert [_threads_of(s) for s in shares] == [2, 2]
    assert _cpus_of(shares[0]).isdisjoint(_cpus_of(shares[1]))
    assert all(_threads_of(s) == 1 for s in cpu_shares(5, list(range(64)), "400000 100000"))


def test_a_node_alone_keeps_its_own_default():
    assert cpu_shares(1, [0, 1, 2, 3], None) == [[]]
    assert cpu_shares(0, [0, 1], None) == []


def test_shares_are_flags_node_join_accepts():
    share = cpu_shares(2, [0, 1, 2, 3], None)[1]
    args = _args(coordinator="c:1", token="t", cpus=share[share.index("--cpus") + 1],
                 threads=_threads_of(share))
    o = resolve_options(args)
    assert o["cpus"] == (2, 3) and o["threads"] == 2


def test_token_bucket_delays():
    now = [0.0]
    bucket = UploadLimiter(8e6, burst_s=0.1, clock=lambda: now[0])  # 1 MB/s, 100 KB burst
    assert bucket.delay_for(100_000) == 0.0
    assert bucket.delay_for(500_000) == pytest.approx(0.5)
    now[0] = 10.0  # long idle: the bucket refills only to its burst
    assert bucket.delay_for(100_000) == 0.0
    assert bucket.delay_for(100_000) == pytest.approx(0.1)


def test_only_when_idle_pauses_and_resumes_with_a_fake_load_signal():
    load, now = [0.0], [0.0]
    monitor = IdleMonitor(lambda: load[0], pause_above=0.3, resume_below=0.15, resume_after_s=30.0,
                          clock=lambda: now[0])
    assert not monitor.check().pause
    load[0] = 0.8  # the owner starts using the machine
    assert monitor.check().pause
    now[0], load[0] = 10.0, 0.2  # a little quieter, not idle
    assert monitor.check().pause
    now[0], load[0] = 20.0, 0.05  # idle from now on
    assert monitor.check().pause
    now[0] = 45.0
    assert monitor.check().pause  # 25 s idle: not yet
    now[0] = 51.0
    decision = monitor.check()
    assert not decision.pause and "resuming" in decision.reason


@pytest.mark.swarm
def test_upload_limit_holds_on_loopback(tmp_path):
    a = start_dht(identity_path=str(tmp_path / "a.key"))
    b = start_dht([str(m) for m in a.get_visible_maddrs()], identity_path=str(tmp_path / "b.key"))
    limit_bps = 16e6
    unchecked = Admission("limits", None, enabled=False)  # this test measures the limiter, not admission
    sender = Exchange(a, "limits", unchecked, limiter=UploadLimiter(limit_bps))
    receiver = Exchange(b, "limits", unchecked)
    try:
        payload = b"x" * 4_000_000
        sender.publish("t", "t/blob", payload)
        started = time.monotonic()
        got = receiver.fetch(sender.peer_id, "t/blob", wait_s=5, timeout=60)
        elapsed = time.monotonic() - started
        assert got == payload
        rate = len(payload) * 8 / elapsed
        assert rate <= 1.10 * limit_bps, f"{rate / 1e6:.1f} Mbit/s through a {limit_bps / 1e6:.0f} Mbit/s limit"
    finally:
        sender.shutdown(linger_s=0)
        receiver.shutdown(linger_s=0)
        b.shutdown()
        a.shutdown()


def _args(**kw):
    return argparse.Namespace(**kw)


def test_node_config_file_with_command_line_overrides(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text('coordinator = "c.example:7450"\ntoken = "ct_x"\nmax_cpus = 2\nmax_memory = "4G"\n'
                    'max_upload_mbps = 10\nonly_when_idle = true\nname = "alice"\n')
    o = resolve_options(_args(config=path, name="bob"))
    assert o["coordinator"] == "c.example:7450" and o["token"] == "ct_x" and o["name"] == "bob"
    assert o["max_cpus"] == 2 and o["max_memory"] == 4 * 2**30 and o["max_upload_mbps"] == 10.0
    assert o["only_when_idle"] is True


@pytest.mark.parametrize("text, message", [("colour = 1\n", "unknown key 'colour'"),
                                           ("max_cpus = 'two'\n", "max_cpus must be int"),
                                           ("[node\n", "not valid TOML")])
def test_node_config_file_errors_name_the_key(tmp_path, text, message):
    path = tmp_path / "node.toml"
    path.write_text(text)
    with pytest.raises(SystemExit, match=message):
        resolve_options(_args(config=path, coordinator="c:1", token="t"))


def test_training_runs_nicer_than_the_threads_started_before_it():
    import os
    import threading

    seen = {}

    def training():
        before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        seen["said"] = lower_thread_priority(5)
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) - before
        child = threading.Thread(target=lambda: seen.update(child=os.getpriority(
            os.PRIO_PROCESS, threading.get_native_id()) - before))
        child.start()
        child.join()

    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=training)
    t.start()
    t.join()
    assert seen["nice"] == min(5, 19 - main) and seen["child"] == seen["nice"], seen  # its threads inherit it
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main  # the others keep theirs


def test_freed_memory_goes_back_to_the_kernel():
    """80 MB freed in the middle of the heap stay resident until release_freed_memory() hands them back."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FREED_THEN_RELEASED], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    sizes = json.loads(out)
    assert sizes["released"]
    assert sizes["freed"] > sizes["before_free"] - 20 * 2**20  # malloc kept what was freed below the pin
    assert sizes["after"] < sizes["freed"] - 60 * 2**20


CPU_LIMITED = """
import json, os, sys, time
from cotrain.node.limits import CpuTimeLimit

try:
    limit = CpuTimeLimit(0.1).__enter__()
except ValueError as e:
    print(json.dumps(dict(skip=str(e))))
    sys.exit(0)
folder = limit.folder
inside = str(os.getpid()) in (folder / "cgroup.procs").read_text().split()
child = os.fork()  # a process started inside stays inside
if child == 0:
    time.sleep(30)
    os._exit(0)
child_inside = str(child) in (folder / "cgroup.procs").read_text().split()
os.kill(child, 9)
os.waitpid(child, 0)
started, until = time.process_time(), time.monotonic() + 1.0
while time.monotonic() < until:
    pass
cpu = time.process_time() - started
stat = dict(line.split() for line in (folder / "cpu.stat").read_text().splitlines())
limit.__exit__(None, None, None)
print(json.dumps(dict(inside=inside, child_inside=child_inside, cpu=cpu, throttled=int(stat["nr_throttled"]),
                      removed=not folder.exists())))
"""


def test_cpu_limit_holds_the_process_and_its_children_to_a_fraction_of_a_core():
    """--cpu-limit 0.1 for real (root, or a delegated cgroup; skipped elsewhere): the process and a child it starts
    are in the node's cgroup, a busy second uses about a tenth of a second of CPU, the kernel says it throttled it,
    and the cgroup is gone after."""
    import json
    import subprocess
    import sys

    out = json.loads(subprocess.run([sys.executable, "-c", CPU_LIMITED], capture_output=True, text=True, timeout=60,
                                    check=True).stdout)
    if "skip" in out:
        pytest.skip(out["skip"])
    assert out["inside"] and out["child_inside"]
    assert out["throttled"] > 0
    assert out["cpu"] < 0.5  # a second's busy loop, 0.1 CPUs of it allowed
    assert out["removed"]


def test_cpu_limit_errors_name_the_flag(tmp_path):
    from cotrain.node.limits import CpuTimeLimit

    with pytest.raises(ValueError, match="--cpu-limit: must be > 0"):
        CpuTimeLimit(0)
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/user.slice/app.scope\n")
    with pytest.raises(ValueError, match="--cpu-limit: no cgroup CPU controller.*systemd-run"):
        CpuTimeLimit(0.5, root=tmp_path / "fs", proc_cgroup=cgroup).__enter__()
    own = tmp_path / "fs" / "user.slice" / "app.scope"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("memory pids\n")  # a v2 cgroup that does not delegate cpu
    with pytest.raises(ValueError, match="--cpu-limit: .*subtree_control"):
        CpuTimeLimit(0.5, root=tmp_path / "fs", proc_cgroup=cgroup).__enter__()
    assert [p.name for p in own.iterdir()] == ["cgroup.controllers"]  # the folder it tried is gone again


def test_cpu_limit_flag_reaches_the_options():
    args = argparse.Namespace(coordinator="h:1", token="t", cpu_limit=0.25)
    assert resolve_options(args)["cpu_limit"] == 0.25
    with pytest.raises(SystemExit, match="--cpu-limit"):
        resolve_options(argparse.Namespace(coordinator="h:1", token="t", cpu_limit=-1.0))
