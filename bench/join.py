"""How long from ``cotrain node join`` to a node's first contributed round, for models of 1M and 20M parameters?

    python bench/join.py [--json FILE]

For each model size a coordinator and two nodes train a char LSTM on 127.0.0.1 until the swarm has made progress;
then a third node is started. The clock runs from its start to the first round it averaged with the others
(``rounds_completed >= 1`` in its heartbeats), through joining, downloading the swarm's state (the size of which is
printed) and training until the round ends.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Swarm, bench_parser, default_text, lstm_config, print_table, work_folder, write_json  # noqa: E402

from cotrain.config import RunConfig  # noqa: E402
from cotrain.cli.launch import wait_for  # noqa: E402
from cotrain.models import build_model, count_parameters  # noqa: E402

SIZES = {"1M": 288, "20M": 1280}  # hidden size of a 2-layer LSTM with a 64-wide byte embedding


def config(data: str, hidden: int, inner_steps: int) -> RunConfig:
    return lstm_config(
        "join", data, hidden, embed_dim=64, layers=2, seq_len=32, batch_size=4,
        averaging={"inner_steps": inner_steps, "matchmaking_time": 3.0, "request_timeout": 2.0,
                   "allreduce_timeout": 300.0, "round_wait": 60.0},
        compression={"kind": "int8"})


def measure(data: str, label: str, hidden: int, inner_steps: int) -> dict:
    cfg = config(data, hidden, inner_steps)
    params = count_parameters(build_model(cfg))
    with work_folder("cotrain-join-") as tmp, Swarm(cfg, tmp) as swarm:
        procs = [swarm.start_node(f"node-{i}", ["--threads", "1", "--wait-peers", "2"]) for i in range(2)]
        wait_for(lambda: swarm.health().totals.global_round >= 2, 1200, interval=1.0,
                 what="the swarm to finish two rounds", procs=procs + [swarm.proc])
        started = time.monotonic()
        joiner = swarm.start_node("joiner", ["--threads", "1"])

        def contributed():
            """The joiner's heartbeat metrics once it has averaged a round with the others."""
            rows = [n.metrics for n in swarm.health().nodes if n.node_name == "joiner"]
            return rows[0] if rows and rows[0].rounds_completed >= 1 else None

        metrics = wait_for(contributed, 1200, interval=0.5, what="the joiner's first round",
                           procs=[*procs, joiner, swarm.proc])
        elapsed = time.monotonic() - started
    # the bytes of shared state the joiner downloaded from its peers (its warm start), as it reports them
    state_bytes = int(metrics.state_bytes_received)
    print(f"  {label}: {params:,} parameters, {state_bytes:,} bytes of state, first round after {elapsed:.1f}s",
          flush=True)
    return {"params": params, "join_to_first_round_s": elapsed, "state_bytes": state_bytes, "label": label}


def main() -> int:
    parser = bench_parser(__doc__)
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
