"""Shared fixtures: a small corpus, and a real coordinator process on 127.0.0.1 (helpers live in tiny_swarm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_swarm import RunningCoordinator, make_text, tiny_config


#: the files that take longest under ``make test`` (seconds of test time on 2 cores, --durations), longest first
LONG_FILES = ("test_swarm.py", "test_faults.py", "test_control_plane.py", "test_fleet.py", "test_warm_start.py",
              "test_rogue_peers.py", "test_nat.py", "test_packaging.py", "test_monitoring.py")


def pytest_collection_modifyitems(session, config, items):
    """The long files first, longest first (a file's own order kept; only scheduling, nothing depends on it): ``make
    test`` hands whole files to two workers in collection order, so the long ones start at once and the short ones
    fill in at the end, instead of a long file (alphabetically late) running alone while the other worker idles."""
    def rank(item) -> int:
        name = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
        return LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES)

    items.sort(key=rank)


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(make_text(200_000))
    return path


@pytest.fixture
def coordinator(tmp_path, corpus_file):
    running = RunningCoordinator(tmp_path, tiny_config(corpus_file))
    yield running
    running.stop()


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tiny models on a shared 2-core machine run far faster on one thread than on torch's default."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
