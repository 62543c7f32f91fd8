"""Shared fixtures: a small corpus, and a real coordinator process on 127.0.0.1 (a
:class:`~cotrain.cli.local_swarm.Swarm`; helpers live in tiny_swarm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cotrain.cli.local_swarm import Swarm
from tiny_swarm import make_text, tiny_config


@pytest.fixture(scope="session")
def node_zygote(tmp_path_factory):
    """One zygote per test worker (cotrain.cli.zygote, as ``cotrain demo`` starts its nodes): the swarm tests fork
    their coordinators and nodes from it instead of starting a Python that imports torch and hivemind each time
    (about 2.5 s of CPU a process, and 40% of these tests' time on 2 cores). The tests of what users type (the
    README's commands, the wheel, signals, exit codes, nodes behind NAT, Ray) start fresh processes."""
    from cotrain.cli.zygote import Zygote

    z = Zygote(tmp_path_factory.mktemp("zygote") / "zygote.log")
    yield z
    z.close()


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(make_text(200_000))
    return path


@pytest.fixture
def coordinator(tmp_path, corpus_file, node_zygote):
    """A swarm of the tiny config in ``tmp_path``, its coordinator running (forked from the zygote); at the end of
    the test, it and every node started through it are stopped."""
    with Swarm(tiny_config(corpus_file), tmp_path, zygote=node_zygote) as running:
        yield running


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tiny models on a shared 2-core machine run far faster on one thread than on torch's default."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def pytest_collection_modifyitems(session, config, items):
    """The files with the most swarm tests first, each file's tests in their order: make test deals whole files to
    its two workers in this order (--no-loadscope-reorder; xdist's own order, by number of tests, dealt the largest
    file, test_swarm.py, a quarter of the suite's time, late, and kept one worker busy half a minute after the
    other had finished). The files of unit tests come last, in small pieces that even the two workers out."""
    weight: dict[str, int] = {}
    for item in items:
        weight[item.nodeid.split("::")[0]] = weight.get(item.nodeid.split("::")[0], 0) + \
            (item.get_closest_marker("swarm") is not None)
    order = {path: i for i, path in enumerate(dict.fromkeys(item.nodeid.split("::")[0] for item in items))}
    items.sort(key=lambda item: (-weight[item.nodeid.split("::")[0]], order[item.nodeid.split("::")[0]]))
