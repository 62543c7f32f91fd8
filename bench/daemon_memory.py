"""Does hivemind's libp2p daemon keep memory for calls its caller gave up on? Two peers on loopback, batch after batch.

    python bench/daemon_memory.py [--calls 2000] [--batches 6] [--gogc 100 50] [--json FILE] [--markdown FILE]
    python bench/daemon_memory.py --report FILE.json [--markdown FILE]

The swarm's requests end in two ways: answered, or cancelled by the caller's timeout (a DHT request past its
``wait_timeout``, a fetch from a peer that went away). A daemon that kept something for each cancelled call (a
goroutine blocked on a reply nobody reads, a connection left open) would grow without bound in a run of days. Peer
B serves a handler that answers after ``--delay`` seconds; peer A calls it ``--calls`` times a batch, 20 at once,
with a timeout above the delay (answered) or below it (cancelled), as a unary call and as a stream. After every batch
the bench reads each daemon's unique memory (USS) and open descriptors. A leak grows batch after batch; a daemon
that only warms up (Go's heap reaching its working size) levels off.

Each mode runs once for each ``--gogc``: the daemons' Go garbage collector target (the heap may grow to 1 + GOGC/100
times what is live before a collection; 100 is Go's default, ``cotrain.averaging.dht.DAEMON_GOGC`` cotrain's), so
the level a daemon settles at is measured side by side for both.

JSON: ``{"rows": [{"mode", "gogc", "batch", "calls", "answered", "caller_uss_mb", "server_uss_mb", "caller_fds",
"server_fds"}], "growth": [{"mode", "gogc", "caller_mb_last_half", "server_mb_last_half", "caller_mb_end",
"server_mb_end"}], "meta"}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hivemind.p2p import P2P  # noqa: E402
from cotrain.averaging.dht import DAEMON_GOGC  # noqa: E402
from hivemind.proto.dht_pb2 import PingRequest, PingResponse  # noqa: E402

from common import bench_parser, interruptible, print_table, run_meta, write_json, write_page  # noqa: E402

MODES = {  # name: (stream, answered)
    "unary_answered": (False, True),
    "unary_cancelled": (False, False),
    "stream_answered": (True, True),
    "stream_cancelled": (True, False),
}


def uss_mb(pid: int) -> float:
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total / 1024


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def run_mode(mode: str, gogc: str, args) -> list[dict]:
    stream, answered = MODES[mode]
    os.environ["GOGC"] = gogc  # the daemons started below take this process's environment
    timeout = args.delay * 5 if answered else args.delay / 2
    caller = await P2P.create()
    server = await P2P.create(initial_peers=[str(m) for m in await caller.get_visible_maddrs()])
    daemons = {"caller": caller._child.pid, "server": server._child.pid}  # hivemind keeps its daemon's Popen here

    async def unary(request, context):
        await asyncio.sleep(args.delay)
        return PingResponse()

    async def streamed(request, context):
        await asyncio.sleep(args.delay)
        yield PingResponse()

    if stream:
        await server.add_protobuf_handler("ping", streamed, PingRequest, stream_output=True)
    else:
        await server.add_protobuf_handler("ping", unary, PingRequest)

    async def call() -> int:
        async def whole():
            if stream:
                async for _ in await caller.iterate_protobuf_handler(server.peer_id, "ping", PingRequest(),
                                                                     PingResponse):
                    pass
            else:
                await caller.call_protobuf_handler(server.peer_id, "ping", PingRequest(), PingResponse)

        try:
            await asyncio.wait_for(whole(), timeout)
            return 1
        except asyncio.TimeoutError:
            return 0

    rows = []
    try:
        await call()  # the connection opens before the first figure
        for batch in range(args.batches + 1):
            done = 0
            if batch:
                for _ in range(args.calls // 20):
                    done += sum(await asyncio.gather(*[call() for _ in range(20)]))
            await asyncio.sleep(2.0)  # the cancellations reach both daemons
            rows.append(dict(mode=mode, gogc=gogc, batch=batch, calls=batch * args.calls, answered=done,
                             caller_uss_mb=round(uss_mb(daemons["caller"]), 1),
                             server_uss_mb=round(uss_mb(daemons["server"]), 1),
                             caller_fds=fds(daemons["caller"]), server_fds=fds(daemons["server"])))
            print(f"{mode}, GOGC={gogc}: batch {batch}: {rows[-1]}", flush=True)
    finally:
        await server.shutdown()
        await caller.shutdown()
    return rows


def growth(rows: list[dict]) -> dict:
    """MB each daemon grew over the last half of the batches (after the warm-up)."""
    half = rows[len(rows) // 2:]
    return dict(mode=rows[0]["mode"], gogc=rows[0].get("gogc", "100"),
                caller_mb_last_half=round(half[-1]["caller_uss_mb"] - half[0]["caller_uss_mb"], 1),
                server_mb_last_half=round(half[-1]["server_uss_mb"] - half[0]["server_uss_mb"], 1),
                caller_mb_end=half[-1]["caller_uss_mb"], server_mb_end=half[-1]["server_uss_mb"])


def report(results: dict) -> None:
    print_table("libp2p daemon memory after batches of calls (USS MB)",
                ["mode", "GOGC", "calls", "answered", "caller MB", "server MB", "caller fds", "server fds"],
                [[r["mode"], r.get("gogc", "100"), r["calls"], r["answered"], r["caller_uss_mb"], r["server_uss_mb"],
                  r["caller_fds"], r["server_fds"]] for r in results["rows"]])
    print_table("growth over the last half of the batches, and the level at the end (MB)",
                ["mode", "GOGC", "caller", "server", "caller at the end", "server at the end"],
                [[g["mode"], g.get("gogc", "100"), g["caller_mb_last_half"], g["server_mb_last_half"],
                  g.get("caller_mb_end", "-"), g.get("server_mb_end", "-")] for g in results["growth"]])


def write_markdown(path: Optional[str], results: dict) -> None:
    if not path:
        return
    m = results.get("meta", {})
    lines = ["# libp2p daemon memory: `bench/daemon_memory.py`", "",
             f"- `{m.get('command', '')}` at commit {m.get('commit', '?')}, {m.get('date', '')}, {m.get('machine', '')}",
             "", "Growth over the last half of the batches (MB of USS; a leak grows batch after batch):", "",
             "| mode | GOGC | caller daemon | server daemon | caller at the end | server at the end |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {g['mode']} | {g.get('gogc', '100')} | {g['caller_mb_last_half']} | {g['server_mb_last_half']} | "
              f"{g.get('caller_mb_end', '-')} | {g.get('server_mb_end', '-')} |" for g in results["growth"]]
    lines += ["", "Every batch:", "",
              "| mode | GOGC | calls | answered | caller MB | server MB | caller fds | server fds |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r.get('gogc', '100')} | {r['calls']} | {r['answered']} | {r['caller_uss_mb']} | {r['server_uss_mb']} | "
              f"{r['caller_fds']} | {r['server_fds']} |" for r in results["rows"]]
    write_page(path, lines)


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="calls a batch")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the handler takes to answer")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--gogc", nargs="+", default=["100", DAEMON_GOGC],
                        help="the daemons' GOGC values to run each mode with (Go's default, then cotrain's)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--report", default=None, metavar="JSON", help="print the table of a run's --json")
    args = parser.parse_args()
    if args.report:
        results = json.loads(Path(args.report).read_text())
        report(results)
        write_markdown(args.markdown, results)
        return 0
    results = dict(rows=[], growth=[], meta=run_meta())
    with interruptible():
        for mode in args.modes:
            for gogc in args.gogc:
                rows = asyncio.run(run_mode(mode, gogc, args))
                results["rows"] += rows
                results["growth"].append(growth(rows))
                write_json(args.json, results)
    report(results)
    write_markdown(args.markdown, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
