"""Shared fixtures: a small corpus, and a real coordinator process on 127.0.0.1 (helpers live in tiny_swarm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_swarm import RunningCoordinator, make_text, tiny_config


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
