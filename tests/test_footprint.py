"""What a process tree costs (cotrain.footprint): the figures a node reports in its heartbeat and checks against
--max-memory."""

import os
import subprocess
import sys

import pytest

from cotrain.footprint import footprint, process_tree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


def test_a_tree_counts_its_children_and_forgets_them_once_gone():
    alone = footprint()
    assert alone.processes >= 1 and alone.rss_bytes > 0 and 0 < alone.pss_bytes <= alone.rss_bytes
    assert alone.threads >= 1 and alone.open_files >= 3 and alone.cpu_s > 0

    # a child holding 64 MB of its own (written, so resident): the tree has it, and its memory
    child = subprocess.Popen([sys.executable, "-c", "import sys; b = bytearray(64 << 20); print('ready', flush=True); "
                                                    "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"ready\n"
        with_child = footprint()
        assert child.pid in process_tree(os.getpid())
        assert with_child.processes == alone.processes + 1
        assert with_child.pss_bytes - alone.pss_bytes > 60 << 20
        own = footprint(descendants=False)  # this process alone: without the child
        assert own.processes == 1 and with_child.pss_bytes - own.pss_bytes > 60 << 20
    finally:
        child.stdin.close()
        child.wait(30)
    assert child.pid not in process_tree(os.getpid())


def test_a_process_that_is_gone_costs_nothing():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    gone = footprint(child.pid)
    assert gone.processes == 0 and gone.pss_bytes == 0
