"""What a node costs this machine in memory, for sizing fleets before they start (``cotrain.sizing``).

    python bench/footprint.py [--hidden 256 1024] [--seconds 40] [--json FILE]

For each model width a coordinator and two nodes (separate processes, as ``cotrain simulate``'s Ray actors and
volunteers run them: no shared zygote) train the default run (the byte-level LSTM, 2 layers, the built-in corpus)
for ``--seconds``; then every node's memory is read from its status.json (the proportional set size of the node,
its DHT process and its libp2p daemon together: what the node adds to the machine), and the coordinator's from
/proc (its tree). A line through the widths' figures splits each into a base and a part per model parameter:
``node_base_bytes`` and ``bytes_per_param``, ``coordinator_base_bytes`` and ``coordinator_bytes_per_param``, the
figures ``cotrain.sizing`` keeps beside its code (tests/test_sizing.py fails when its estimate of a row drifts more
than 25% from docs/results/footprint.json, this bench's output).

JSON: ``{"rows": [{"hidden", "params", "node_pss_bytes", "coordinator_pss_bytes"}], "node_base_bytes",
"bytes_per_param", "coordinator_base_bytes", "coordinator_bytes_per_param", "meta"}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (Swarm, bench_parser, print_table, run_meta, swarm_config, wait_for, work_folder,  # noqa: E402
                    write_json)

from cotrain.footprint import footprint  # noqa: E402
from cotrain.models import build_model, count_parameters  # noqa: E402


def measure(hidden: int, seconds: float, keep: bool) -> dict:
    cfg = swarm_config(run={"name": f"footprint-{hidden}"}, model={"hidden_size": hidden}, device="cpu")
    params = count_parameters(build_model(cfg))
    names = ["node-0", "node-1"]
    with work_folder(f"cotrain-footprint-{hidden}-", keep=keep) as work:
        with Swarm(cfg, work, nodes=len(names)) as swarm:
            for name in names:
                swarm.start_node(name, ["--wait-peers", str(len(names))])
            statuses = [work / name / "status.json" for name in names]
            wait_for(lambda: all(p.exists() for p in statuses), 300, interval=1.0, what="the nodes to train")
            deadline, peak = time.monotonic() + seconds, [0] * len(names)
            coordinator_peak = 0
            while time.monotonic() < deadline:  # the highest figure each reports while it trains
                for i, path in enumerate(statuses):
                    try:
                        peak[i] = max(peak[i], int(json.loads(path.read_text()).get("memory_bytes", 0)))
                    except (OSError, ValueError):
                        pass
                coordinator_peak = max(coordinator_peak, footprint(swarm.proc.popen.pid).pss_bytes)
                time.sleep(2.0)
    row = dict(hidden=hidden, params=params, node_pss_bytes=max(peak), coordinator_pss_bytes=coordinator_peak)
    print(f"hidden {hidden}: {params:,} parameters, a node {max(peak) / 2**20:.0f} MB, the coordinator "
          f"{coordinator_peak / 2**20:.0f} MB", flush=True)
    return row


def fit(rows: list[dict], key: str = "node_pss_bytes") -> tuple[int, float]:
    """(base, bytes a parameter) of the line through the rows' (params, ``key``), least squares."""
    if len(rows) < 2:
        return rows[0][key], 0.0
    xs, ys = [r["params"] for r in rows], [r[key] for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return int(my - slope * mx), slope


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--seconds", type=float, default=40.0, help="seconds each width trains while measured")
    parser.add_argument("--json", default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    rows = []
    for hidden in args.hidden:
        rows.append(measure(hidden, args.seconds, args.keep))
        base, per_param = fit(rows)
        coordinator_base, coordinator_per_param = fit(rows, "coordinator_pss_bytes")
        write_json(args.json, dict(rows=rows, node_base_bytes=base, bytes_per_param=round(per_param, 2),
                                   coordinator_base_bytes=coordinator_base,
                                   coordinator_bytes_per_param=round(coordinator_per_param, 2), meta=run_meta()))
    print_table("memory a node and the coordinator take (PSS, their processes together)",
                ["hidden", "parameters", "node MB", "coordinator MB"],
                [[r["hidden"], r["params"], round(r["node_pss_bytes"] / 2**20), round(r["coordinator_pss_bytes"] / 2**20)]
                 for r in rows])
    print(f"a node: {base / 2**20:.0f} MB + {per_param:.1f} bytes a parameter; the coordinator: "
          f"{coordinator_base / 2**20:.0f} MB + {coordinator_per_param:.1f} bytes a parameter")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
