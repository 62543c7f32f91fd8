"""How many heartbeats can one coordinator take? Thousands of simulated nodes join, then heartbeat as fast as they
can, from this process (asyncio gRPC clients) against a real coordinator process on 127.0.0.1. Every simulated node
heartbeats on a stream of its own, as real nodes do (``HeartbeatStream``); a second run with one unary call per
heartbeat (``Heartbeat``) gives the comparison.

    python bench/coordinator_load.py [--nodes 2000] [--seconds 20] [--concurrency 64] [--json FILE]

Prints joins per second, heartbeats per second handled, and heartbeat latency percentiles. The load generator
shares the machine's cores with the coordinator, so the figures are a floor for a coordinator on its own machine.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc  # noqa: E402

from common import Swarm, print_table, swarm_config, work_folder, write_json  # noqa: E402

from cotrain.protocol import PROTOCOL_VERSION  # noqa: E402
from cotrain.v1 import coordinator_pb2 as pb  # noqa: E402
from cotrain.v1 import coordinator_pb2_grpc as pb_grpc  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def drive(address: str, token: str, nodes: int, seconds: float, concurrency: int, channels: int,
                unary: bool = False) -> dict:
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
    streams: dict = {}  # node -> its heartbeat stream, opened on first use (and again after an error)
    deadline = time.monotonic() + seconds

    async def worker(w: int):
        nonlocal errors
        mine = range(w, len(sessions), concurrency)  # each node's stream has one writer
        k = 0
        while mine and time.monotonic() < deadline:
            i = mine[k % len(mine)]
            node_id, session = sessions[i]
            k += 1
            request = pb.HeartbeatRequest(node_id=node_id, session=session, metrics=pb.NodeMetrics(
                step=k, loss=2.0, samples_per_s=10.0, bytes_sent=k))
            t0 = time.perf_counter()
            try:
                if unary:
                    await stubs[w % channels].Heartbeat(request, timeout=10)
                else:
                    if i not in streams:
                        streams[i] = stubs[i % channels].HeartbeatStream()
                    await streams[i].write(request)
                    await asyncio.wait_for(streams[i].read(), timeout=10)
                latencies.append(time.perf_counter() - t0)
            except (grpc.aio.AioRpcError, asyncio.TimeoutError, asyncio.InvalidStateError) as e:
                if errors == 0:
                    print(f"first error: {e!r}", flush=True)
                errors += 1
                stream = streams.pop(i, None)  # as a node does: a new stream for the next heartbeat
                if stream is not None:
                    stream.cancel()

    hb_started = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.monotonic() - hb_started
    for stream in streams.values():
        await stream.done_writing()
    for c in chans:
        await c.close()
    return {"nodes": nodes, "joins_per_s": nodes / join_s, "heartbeats": len(latencies), "errors": errors,
            "heartbeats_per_s": len(latencies) / elapsed, "p50_ms": 1000 * percentile(latencies, 0.5),
            "p99_ms": 1000 * percentile(latencies, 0.99)}


def one_run(args, unary: bool) -> dict:
    """A fresh coordinator, ``args.nodes`` joins, then heartbeats for ``args.seconds``."""
    with work_folder("cotrain-load-") as tmp:
        corpus = tmp / "corpus.txt"
        corpus.write_text("the swarm trains one model together. " * 2000)
        cfg = swarm_config(data={"source": str(corpus), "batch_size": 2, "seq_len": 16},
                           coordinator={"join_rate_per_s": 0.0, "heartbeat_rate_per_s": 0.0,
                                        "heartbeat_interval_s": 60.0})
        with Swarm(cfg, tmp, token_name="load") as swarm:  # the coordinator alone: the nodes are simulated here
            return asyncio.run(drive(swarm.address, swarm.token, args.nodes, args.seconds, args.concurrency,
                                     args.channels, unary))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=64, help="heartbeats in flight")
    parser.add_argument("--channels", type=int, default=0,
                        help="gRPC connections (default: one per 64 nodes; a connection carries at most 100 streams)")
    parser.add_argument("--skip-unary", action="store_true", help="only the heartbeat streams nodes use")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.nodes < 1 or args.seconds <= 0 or args.concurrency < 1:
        parser.error("--nodes, --seconds and --concurrency: must be positive")
    args.channels = args.channels or max(1, -(-args.nodes // 64))
    result = one_run(args, unary=False)
    unary = None if args.skip_unary else one_run(args, unary=True)
    rows = [["stream per node (what nodes use)", result]] + ([["unary call per heartbeat", unary]] if unary else [])
    print_table("coordinator load (one coordinator, one load generator, same machine)",
                ["transport", "nodes", "joins/s", "heartbeats/s", "p50 ms", "p99 ms", "errors", "vs unary"],
                [[name, r["nodes"], r["joins_per_s"], r["heartbeats_per_s"], r["p50_ms"], r["p99_ms"], r["errors"],
                  f"{r['heartbeats_per_s'] / unary['heartbeats_per_s']:.2f}x" if unary else "-"] for name, r in rows])
    figures = {k: result[k] for k in ("nodes", "heartbeats_per_s", "p50_ms", "p99_ms", "joins_per_s", "errors")}
    if unary:
        figures["unary"] = {k: unary[k] for k in ("heartbeats_per_s", "p50_ms", "p99_ms", "errors")}
    write_json(args.json, figures | {"transport": "stream"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
