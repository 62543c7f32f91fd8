"""How many heartbeats can one coordinator take? Thousands of simulated nodes join, then heartbeat as fast as they
can, from this process (asyncio gRPC clients) against a real coordinator process on 127.0.0.1.

    python bench/coordinator_load.py [--nodes 2000] [--seconds 20] [--concurrency 64] [--json FILE]

Prints joins per second, heartbeats per second handled, and heartbeat latency percentiles. The load generator
shares the machine's cores with the coordinator, so the figures are a floor for a coordinator on its own machine.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc  # noqa: E402

from common import print_table, write_json  # noqa: E402

from cotrain.config import RunConfig  # noqa: E402
from cotrain.coordinator.store import Store  # noqa: E402
from cotrain.launch import start_coordinator  # noqa: E402
from cotrain.protocol import PROTOCOL_VERSION  # noqa: E402
from cotrain.v1 import coordinator_pb2 as pb  # noqa: E402
from cotrain.v1 import coordinator_pb2_grpc as pb_grpc  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def drive(address: str, token: str, nodes: int, seconds: float, concurrency: int, channels: int) -> dict:
    chans = [grpc.aio.insecure_channel(address) for _ in range(channels)]
    stubs = [pb_grpc.CoordinatorStub(c) for c in chans]
    sessions: list[tuple[str, str]] = []
    started = time.monotonic()

    async def join(i: int):
        r = await stubs[i % channels].Join(pb.JoinRequest(token=token, node_name=f"sim-{i}",
                                                          protocol_version=PROTOCOL_VERSION), timeout=30)
        sessions.append((r.node_id, r.session))

    for start in range(0, nodes, concurrency):
        await asyncio.gather(*(join(i) for i in range(start, min(nodes, start + concurrency))))
    join_s = time.monotonic() - started

    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds

    async def worker(w: int):
        nonlocal errors
        k = w
        while time.monotonic() < deadline:
            node_id, session = sessions[k % len(sessions)]
            k += concurrency
            request = pb.HeartbeatRequest(node_id=node_id, session=session, metrics=pb.NodeMetrics(
                step=k, loss=2.0, samples_per_s=10.0, bytes_sent=k))
            t0 = time.perf_counter()
            try:
                await stubs[w % channels].Heartbeat(request, timeout=10)
                latencies.append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError:
                errors += 1

    hb_started = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.monotonic() - hb_started
    for c in chans:
        await c.close()
    return {"nodes": nodes, "joins_per_s": nodes / join_s, "heartbeats": len(latencies), "errors": errors,
            "heartbeats_per_s": len(latencies) / elapsed, "p50_ms": 1000 * percentile(latencies, 0.5),
            "p99_ms": 1000 * percentile(latencies, 0.99)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=64, help="heartbeats in flight")
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cotrain-load-"))
    corpus = tmp / "corpus.txt"
    corpus.write_text("the swarm trains one model together. " * 2000)
    cfg = RunConfig().with_overrides(data={"source": str(corpus), "batch_size": 2, "seq_len": 16},
                                     coordinator={"join_rate_per_s": 0.0, "heartbeat_rate_per_s": 0.0,
                                                  "heartbeat_interval_s": 60.0})
    (tmp / "run.toml").write_text(cfg.to_toml())
    token = Store(tmp / "state").create_token("load")
    proc, address = start_coordinator(tmp / "state", tmp / "run.toml")
    try:
        result = asyncio.run(drive(address, token, args.nodes, args.seconds, args.concurrency, args.channels))
    finally:
        proc.stop(30)
        shutil.rmtree(tmp, ignore_errors=True)
    print_table("coordinator load (one coordinator, one load generator, same machine)",
                ["nodes", "joins/s", "heartbeats/s", "p50 ms", "p99 ms", "errors"],
                [[result["nodes"], result["joins_per_s"], result["heartbeats_per_s"], result["p50_ms"],
                  result["p99_ms"], result["errors"]]])
    write_json(args.json, {k: result[k] for k in ("nodes", "heartbeats_per_s", "p50_ms", "p99_ms")} |
               {"joins_per_s": result["joins_per_s"], "errors": result["errors"]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
