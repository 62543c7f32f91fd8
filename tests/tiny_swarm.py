"""What the tests run a swarm with: a small generated corpus, a tiny run config, and peers in the test's own process.
The swarm of real processes on 127.0.0.1 is :class:`cotrain.cli.local_swarm.Swarm`, the benches' too. Test files
import these; conftest.py holds only fixtures."""

from __future__ import annotations

import random
import threading
from contextlib import contextmanager
from pathlib import Path

from cotrain.config import RunConfig
from cotrain.cli.local_swarm import swarm_config


@contextmanager
def exchanges(keys: Path, namespace: str, n: int = 3):
    """``n`` peers in this process, each with its own DHT (and key: peers in one process share one unless given their
    own) and an :class:`Exchange` that admits everyone; all shut down after the block, exchanges before DHTs."""
    from cotrain.averaging import Admission, Exchange, start_dht  # hivemind: only for the tests that start peers
    first = start_dht(identity_path=str(keys / "0.key"))
    dhts = [first] + [start_dht([str(m) for m in first.get_visible_maddrs()], identity_path=str(keys / f"{i}.key"))
                      for i in range(1, n)]
    out = [Exchange(d, namespace, Admission("test", None, enabled=False)) for d in dhts]
    try:
        yield out
    finally:
        for e in out:
            e.shutdown()
        for d in dhts:
            d.shutdown()


def run_peers(count: int, one, join_s: float, skip=()) -> None:
    """``one(i)`` for every peer i not in ``skip``, each in a thread of its own (the peers of one all-reduce run at
    once); returns when all have ended or ``join_s`` has passed for each."""
    threads = [threading.Thread(target=one, args=(i,)) for i in range(count) if i not in skip]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)


WORDS = ("the swarm trains one model together while volunteers come and go and every node averages its "
         "update with its peers so the shared model moves forward round after round").split()


def make_text(n_bytes: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_bytes:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + ".\n"
        out.append(sentence)
        size += len(sentence)
    return "".join(out)[:n_bytes]


def tiny_config(corpus: Path, **overrides) -> RunConfig:
    """The tests' run: a tiny LSTM on the text file ``corpus`` on the CPU, rounds of 10 steps with short timeouts, a
    constant lr; ``overrides`` add to it as :func:`~cotrain.cli.local_swarm.swarm_config` merges them."""
    return swarm_config(dict(
        run={"name": "test", "seed": 1},
        model={"kind": "lstm", "embed_dim": 16, "hidden_size": 64, "num_layers": 1, "dropout": 0.0},
        data={"source": str(corpus), "seq_len": 32, "batch_size": 8},
        optimizer={"lr": 0.01},
        # the tests' runs last a few rounds of a few hundred samples: the peak lr from the first step, no decay
        schedule={"kind": "constant", "warmup_samples": 0},
        averaging={"inner_steps": 10, "matchmaking_time": 2.0, "request_timeout": 1.5, "progress_interval": 0.5,
                   "allreduce_timeout": 20.0, "round_wait": 20.0},
        coordinator={"heartbeat_interval_s": 0.5, "lost_after_missed": 20, "checkpoint_interval_s": 2.0,
                     "eval_bytes": 8192, "unit_bytes": 16384},
        device="cpu",
    ), overrides)
