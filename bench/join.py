"""How long from ``cotrain node join`` to a node's first contributed round, for models of 1M and 20M parameters?

    python bench/join.py [--json FILE]

For each model size a coordinator and two nodes train a char LSTM on 127.0.0.1 until the swarm has made progress;
then a third node is started. The clock runs from its start to the first round it averaged with the others
(``rounds_completed >= 1`` in its heartbeats), through joining, downloading the swarm's state (the size of which is
printed) and training until the round ends.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import default_text, print_table, write_json  # noqa: E402

from cotrain.config import RunConfig  # noqa: E402
from cotrain.coordinator.store import Store  # noqa: E402
from cotrain.cli.launch import start_coordinator, start_node, wait_for  # noqa: E402
from cotrain.models import build_model, count_parameters  # noqa: E402
from cotrain.client import CoordinatorClient  # noqa: E402

SIZES = {"1M": 288, "20M": 1280}  # hidden size of a 2-layer LSTM with a 64-wide byte embedding


def config(data: str, hidden: int, inner_steps: int) -> RunConfig:
    return RunConfig.from_dict(dict(
        run={"name": "join"},
        model={"kind": "lstm", "embed_dim": 64, "hidden_size": hidden, "num_layers": 2, "dropout": 0.0},
        data={"source": data, "seq_len": 32, "batch_size": 4},
        averaging={"inner_steps": inner_steps, "matchmaking_time": 3.0, "request_timeout": 2.0,
                   "allreduce_timeout": 300.0, "round_wait": 60.0},
        compression={"kind": "int8"},
        coordinator={"checkpoint_interval_s": 3600.0},
        device="cpu"))


def measure(data: str, label: str, hidden: int, inner_steps: int) -> dict:
    cfg = config(data, hidden, inner_steps)
    params = count_parameters(build_model(cfg))
    tmp = Path(tempfile.mkdtemp(prefix="cotrain-join-"))
    (tmp / "run.toml").write_text(cfg.to_toml())
    token = Store(tmp / "coordinator").create_token("bench")
    coordinator, address = start_coordinator(tmp / "coordinator", tmp / "run.toml")
    client = CoordinatorClient(address, insecure=True)
    procs = []
    try:
        procs = [start_node(address, token, f"node-{i}", tmp / f"node-{i}", extra=["--threads", "1", "--wait-peers", "2"])
                 for i in range(2)]
        wait_for(lambda: client.health().totals.global_round >= 2, 1200, interval=1.0,
                 what="the swarm to finish two rounds", procs=procs + [coordinator])
        started = time.monotonic()
        joiner = start_node(address, token, "joiner", tmp / "joiner", extra=["--threads", "1"])
        procs.append(joiner)

        def contributed():
            rows = [n for n in client.health().nodes if n.node_name == "joiner"]
            return rows and rows[0].metrics.rounds_completed >= 1

        wait_for(contributed, 1200, interval=0.5, what="the joiner's first round", procs=procs + [coordinator])
        elapsed = time.monotonic() - started
        log = joiner.log()
    finally:
        client.close()
        for p in procs:
            p.stop(30)
        coordinator.stop(30)
        shutil.rmtree(tmp, ignore_errors=True)
    found = re.search(r"downloaded (\d+) bytes of state", log)
    state_bytes = int(found.group(1)) if found else 0
    print(f"  {label}: {params:,} parameters, {state_bytes:,} bytes of state, first round after {elapsed:.1f}s",
          flush=True)
    return {"params": params, "join_to_first_round_s": elapsed, "state_bytes": state_bytes, "label": label}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="text file (default ../shared/data/tinyshakespeare.txt)")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--inner-steps", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    runs = [measure(args.data or default_text(), label, SIZES[label], args.inner_steps) for label in args.sizes]
    print_table("join: from `cotrain node join` to the node's first contributed round",
                ["model", "parameters", "state bytes", "join -> first round s"],
                [[r["label"], r["params"], r["state_bytes"], r["join_to_first_round_s"]] for r in runs])
    write_json(args.json, {"runs": [{k: r[k] for k in ("params", "join_to_first_round_s", "state_bytes")}
                                    for r in runs]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
