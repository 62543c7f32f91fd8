"""COTRAIN_TRACEMALLOC (cotrain.memory.trace_allocations_from_env): a process that grows names where it grows."""

import os
import subprocess
import sys
import textwrap

from cotrain.memory import TRACE_ENV, TRACE_EVERY_ENV, trace_allocations_from_env

GROWER = textwrap.dedent("""
    import time
    from pathlib import Path
    from cotrain.memory import trace_allocations_from_env

    assert trace_allocations_from_env("grower")
    kept = []

    def leak_here():
        kept.append(bytearray(100_000))

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any("bytearray" in p.read_text() for p in Path(".").glob("grower-*.txt")):
        leak_here()
        time.sleep(0.01)
""")


def test_without_the_variable_nothing_is_traced(monkeypatch):
    monkeypatch.delenv(TRACE_ENV, raising=False)
    assert trace_allocations_from_env("test") is None


def test_a_growing_process_reports_the_line_that_grows(tmp_path):
    env = dict(os.environ, **{TRACE_ENV: str(tmp_path), TRACE_EVERY_ENV: "1"})
    (tmp_path / "grower.py").write_text(GROWER)  # a file: its frames show their source lines
    done = subprocess.run([sys.executable, "grower.py"], cwd=tmp_path, env=env, timeout=90, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    (report,) = list(tmp_path.glob("grower-*.txt"))
    text = report.read_text()
    first = text.splitlines()[1]
    assert first.startswith("+") and "kB" in first  # the largest growth is first, and it is the leak
    assert "kept.append(bytearray(100_000))" in "\n".join(text.splitlines()[:4])  # the line that allocates


def test_the_tensor_census_sees_tensors_that_pile_up():
    import torch

    from cotrain.memory import census_lines, tensor_census

    before = tensor_census()
    kept = [torch.zeros(3, 1000) for _ in range(5)]
    view = kept[0][1]  # a view: its storage counted once
    now = tensor_census()
    assert now[((3, 1000), "float32")][0] - before.get(((3, 1000), "float32"), (0, 0))[0] == 5
    lines = census_lines(before, now)
    assert "[3, 1000] float32: +5 tensors, +60 kB" in "\n".join(lines), lines
    del kept, view
