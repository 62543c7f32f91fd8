"""Does anything leak over hours? A 3-node swarm with the defaults, disturbed the way long runs are, watched every
minute.

    python bench/soak.py --minutes 45 --json FILE [--markdown docs/results/soak.md]

A coordinator and three nodes train the default run (the byte-level LSTM 2x256 on the built-in corpus). Every
``--disturb-every`` minutes (10) node-2 is killed (SIGKILL) and started again with its identity, and node-1 is
frozen (SIGSTOP) past the round's all-reduce deadline, then thawed: leaks in swarms like this one come from failed
rounds and peers that come back. Every minute the bench reads, for every process of the coordinator and of each node
(the node, its DHT process, its libp2p daemon), its unique memory (USS: the pages no other process shares), its open
file descriptors and its threads, and the swarm's latest validation BPC; and its resident memory (RSS).

USS and RSS answer different questions. A process forked from another (hivemind forks the DHT process from the
node, and the node from the zygote) shares its parent's pages until either writes to one, and Python writes to
every object it touches (reference counts): the page is copied, and becomes private to both, so USS grows while
RSS, which counts every resident page of the process, does not. That growth is bounded by what was shared at the
fork. Memory a process adds itself (a leak) grows both.

It reports, for each long-lived process (the coordinator's, node-0's and node-1's; node-2's restart every time),
the slope of each figure after the first ``--settle`` minutes (10), by least squares: MB an hour, descriptors an hour,
threads an hour, and the memory slope as a share of the process's memory an hour; and the memory's robust slope
(Theil-Sen: the median of the slopes between every two minutes). A node's memory steps up and down by tens of MB as
it downloads a state, averages a round or is frozen and thawed, and over a run of minutes least squares reads one
such step as a trend; a leak is a rise that most pairs of minutes show. So the bench also reads every process every
``--floor-every`` seconds (10) and keeps the least it held in each minute (``uss_floor_bytes``,
``rss_floor_bytes``): a round's buffers come and go within the minute, what a process keeps is in its floor, and the
floor's robust slope is what the bench judges by. The JSON is written after every
minute, so a run of hours can be read while it goes on. A 6-hour run: ``nohup python bench/soak.py --minutes 360
--json soak.json &``, then ``python bench/soak.py --report soak.json``. ``--tracemalloc DIR``: every process of the
swarm writes the Python allocation sites that grew most to DIR (what to look at when a slope is not flat).

A killed node's processes (its DHT process and libp2p daemon) must end with it: the pids of those still running are
listed at every minute (``left_behind``).

JSON: ``{"minutes", "samples": [{"minute", "val_bpc", "left_behind": [pid], "processes": [{"who", "pid",
"uss_bytes", "rss_bytes", "uss_floor_bytes", "rss_floor_bytes", "fds", "threads"}]}], "slopes": [{"who",
"uss_mb_per_hour", "uss_percent_per_hour", "robust_percent_per_hour", "floor_percent_per_hour",
"floor_rss_percent_per_hour", "rss_mb", "robust_rss_percent_per_hour", "fds_per_hour", "threads_per_hour"}],
"events": [[minute, what]], "meta"}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (Swarm, bench_parser, interruptible, print_table, run_meta, swarm_config, wait_for,  # noqa: E402
                    work_folder, write_json, write_page)

from cotrain.coordinator.store import read_evals  # noqa: E402
from cotrain.footprint import process_tree  # noqa: E402
from cotrain.memory import TRACE_ENV, TRACE_EVERY_ENV  # noqa: E402

NODES = ("node-0", "node-1", "node-2")
RESTARTED, FROZEN = "node-2", "node-1"
#: the processes whose slopes the bench judges: they live through the whole run
LONG_LIVED = ("coordinator", "node-0", "node-1")


def process_figures(pid: int) -> Optional[dict]:
    """USS, RSS, open descriptors and threads of one process; None when it is gone."""
    base = Path(f"/proc/{pid}")
    try:
        uss = rss = 0
        for line in (base / "smaps_rollup").read_text().splitlines():
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                uss += int(line.split()[1]) * 1024
            elif line.startswith("Rss:"):
                rss = int(line.split()[1]) * 1024
        threads = next(int(line.split()[1]) for line in (base / "status").read_text().splitlines()
                       if line.startswith("Threads:"))
        fds = len(os.listdir(base / "fd"))
        role = (base / "comm").read_text().strip()
    except (OSError, ValueError, StopIteration):
        return None
    return dict(pid=pid, uss_bytes=uss, rss_bytes=rss, fds=fds, threads=threads, comm=role)


def sample(swarm: Swarm, nodes: dict) -> list[dict]:
    """Every process of the coordinator and of each node, with whose it is (``node-1/2``: node-1's second process
    in its tree, in pid order: the node, then what it started)."""
    out = []
    trees = {"coordinator": swarm.proc.pid, **{name: proc.pid for name, proc in nodes.items()}}
    for who, root in trees.items():
        for i, pid in enumerate(sorted(process_tree(root))):
            figures = process_figures(pid)
            if figures:
                out.append(dict(figures, who=f"{who}/{i}" if i else who))
    return out


class Floors:
    """The least USS and RSS each process held since the last minute's sample, read every few seconds."""

    def __init__(self):
        self.least: dict[int, tuple[int, int]] = {}

    def read(self, swarm: Swarm, nodes: dict) -> list[dict]:
        processes = sample(swarm, nodes)
        for p in processes:
            uss, rss = self.least.get(p["pid"], (p["uss_bytes"], p["rss_bytes"]))
            self.least[p["pid"]] = (min(uss, p["uss_bytes"]), min(rss, p["rss_bytes"]))
        return processes

    def minute(self, swarm: Swarm, nodes: dict) -> list[dict]:
        """This minute's sample of every process, with its floors since the last; the floors start again."""
        processes = self.read(swarm, nodes)
        for p in processes:
            p["uss_floor_bytes"], p["rss_floor_bytes"] = self.least[p["pid"]]
        self.least.clear()
        return processes


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minute, value) points, per hour."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if var == 0 else 60.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var


def robust_slope(points: list[tuple[float, float]]) -> float:
    """Theil-Sen slope of (minute, value) points, per hour: the median of the slopes between every two points."""
    pairs = sorted((y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:] if x2 > x1)
    if not pairs:
        return 0.0
    mid = len(pairs) // 2
    return 60.0 * (pairs[mid] if len(pairs) % 2 else (pairs[mid - 1] + pairs[mid]) / 2)


def slopes(samples: list[dict], settle: float) -> list[dict]:
    """Each long-lived process's slopes after ``settle`` minutes (a process is one ``who`` that kept its pid)."""
    series: dict[tuple[str, int], list[tuple[float, dict]]] = {}
    for s in samples:
        if s["minute"] < settle:
            continue
        for p in s["processes"]:
            if p["who"].split("/")[0] in LONG_LIVED:
                series.setdefault((p["who"], p["pid"]), []).append((s["minute"], p))
    out = []
    for (who, pid), points in sorted(series.items()):
        if len(points) < 3:
            continue
        mbs = [(m, p["uss_bytes"] / 2**20) for m, p in points]
        uss, robust = slope(mbs), robust_slope(mbs)
        mean_mb = sum(p["uss_bytes"] for _, p in points) / len(points) / 2**20
        rss = [(m, p.get("rss_bytes", 0) / 2**20) for m, p in points]
        mean_rss = sum(v for _, v in rss) / len(rss)
        floor = [(m, p.get("uss_floor_bytes", p["uss_bytes"]) / 2**20) for m, p in points]
        floor_rss = [(m, p.get("rss_floor_bytes", p.get("rss_bytes", 0)) / 2**20) for m, p in points]
        mean_floor = sum(v for _, v in floor) / len(floor)
        mean_floor_rss = sum(v for _, v in floor_rss) / len(floor_rss)
        out.append(dict(who=who, pid=pid, comm=points[-1][1]["comm"], minutes=len(points),
                        rss_mb=round(rss[-1][1], 1),
                        robust_rss_percent_per_hour=round(100 * robust_slope(rss) / mean_rss, 2) if mean_rss else 0.0,
                        uss_mb=round(points[-1][1]["uss_bytes"] / 2**20, 1), uss_mb_per_hour=round(uss, 2),
                        uss_percent_per_hour=round(100 * uss / mean_mb, 2) if mean_mb else 0.0,
                        robust_percent_per_hour=round(100 * robust / mean_mb, 2) if mean_mb else 0.0,
                        floor_mb=round(floor[-1][1], 1),
                        floor_percent_per_hour=round(100 * robust_slope(floor) / mean_floor, 2) if mean_floor else 0.0,
                        floor_rss_percent_per_hour=(round(100 * robust_slope(floor_rss) / mean_floor_rss, 2)
                                                    if mean_floor_rss else 0.0),
                        fds_per_hour=round(slope([(m, p["fds"]) for m, p in points]), 2),
                        threads_per_hour=round(slope([(m, p["threads"]) for m, p in points]), 2)))
    return out


def latest_bpc(swarm: Swarm) -> Optional[float]:
    evals = read_evals(swarm.state_dir)
    return round(evals[-1].val_bpc, 4) if evals else None


def run(args) -> dict:
    cfg = swarm_config(run={"name": "soak"}, device="cpu")
    freeze_s = cfg.averaging.allreduce_timeout + cfg.averaging.matchmaking_time + 5.0
    results = dict(minutes=args.minutes, samples=[], slopes=[], events=[], meta=run_meta(), freeze_s=freeze_s)
    with work_folder("cotrain-soak-", keep=args.keep) as work, Swarm(cfg, work, nodes=len(NODES)) as swarm:
        nodes = {name: swarm.start_node(name, ["--wait-peers", "2"] if name != RESTARTED else []) for name in NODES}
        wait_for(lambda: all((work / n / "status.json").exists() for n in NODES), 300, interval=1.0,
                 what="the nodes to train", procs=list(nodes.values()))
        started = time.monotonic()
        next_sample, next_disturb, next_floor = 0.0, args.disturb_every, 0.0
        floors = Floors()
        gone: set[int] = set()  # the processes of every node-2 killed: each must have ended with it
        while (minute := (time.monotonic() - started) / 60) < args.minutes:
            if minute >= next_disturb:
                next_disturb += args.disturb_every
                gone |= set(process_tree(nodes[RESTARTED].pid))
                nodes[RESTARTED].kill()  # a crash: no leaving, its peers find out
                nodes[RESTARTED] = swarm.start_node(RESTARTED)
                results["events"].append([round(minute, 2), f"{RESTARTED} killed and started again"])
                nodes[FROZEN].signal(signal.SIGSTOP)  # its groupmates' round waits on it past the deadline
                time.sleep(freeze_s)
                nodes[FROZEN].signal(signal.SIGCONT)
                results["events"].append([round(minute, 2), f"{FROZEN} frozen {freeze_s:.0f}s"])
            if minute >= next_sample:
                next_sample += 1.0
                left = sorted(p for p in gone if Path(f"/proc/{p}").exists() and process_figures(p))
                results["samples"].append(dict(minute=round(minute, 2), val_bpc=latest_bpc(swarm),
                                               processes=floors.minute(swarm, nodes), left_behind=left))
                results["slopes"] = slopes(results["samples"], args.settle)
                write_json(args.json, results)
                print(f"minute {minute:.0f}: val {results['samples'][-1]['val_bpc']} BPC, "
                      f"{len(results['samples'][-1]['processes'])} processes", flush=True)
                next_floor = time.monotonic() + args.floor_every
            elif time.monotonic() >= next_floor:
                floors.read(swarm, nodes)
                next_floor = time.monotonic() + args.floor_every
            for name, proc in nodes.items():
                if not proc.alive():
                    raise RuntimeError(f"{name} exited (code {proc.popen.returncode}); logs in {work}")
            time.sleep(1.0)
    results["complete"] = True
    return results


def report(results: dict) -> None:
    print_table(f"soak: {results['minutes']} minutes, slopes after the first {results.get('settle', 10)}",
                ["process", "command", "minutes", "USS MB", "MB / hour", "% / hour", "robust % / hour", "floor MB",
                 "floor % / hour", "RSS MB", "RSS robust % / hour", "RSS floor % / hour", "fds / hour",
                 "threads / hour"],
                [[s["who"], s["comm"], s["minutes"], s["uss_mb"], s["uss_mb_per_hour"], s["uss_percent_per_hour"],
                  s.get("robust_percent_per_hour", ""), s.get("floor_mb", ""), s.get("floor_percent_per_hour", ""),
                  s.get("rss_mb", ""), s.get("robust_rss_percent_per_hour", ""),
                  s.get("floor_rss_percent_per_hour", ""), s["fds_per_hour"], s["threads_per_hour"]]
                 for s in results["slopes"]])
    bpcs = [(s["minute"], s["val_bpc"]) for s in results["samples"] if s["val_bpc"] is not None]
    if bpcs:
        print("validation BPC by minute: " + ", ".join(f"{m:.0f}: {b:.3f}" for m, b in bpcs[::5]))


def write_markdown(path: Optional[str], results: dict) -> None:
    if not path:
        return
    m = results.get("meta", {})
    lines = [f"# Soak: `bench/soak.py`, {results['minutes']} minutes", "",
             f"- `{m.get('command', '')}` at commit {m.get('commit', '?')}, {m.get('date', '')}, {m.get('machine', '')}",
             f"- disturbances: {len(results['events'])} ({', '.join(e[1] for e in results['events'][:2])}, ...)",
             "", "| process | command | minutes | USS MB | MB / hour | % / hour | robust % / hour | floor MB | "
             "floor % / hour | RSS MB | RSS robust % / hour | RSS floor % / hour | fds / hour | threads / hour |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {s['who']} | {s['comm']} | {s['minutes']} | {s['uss_mb']} | {s['uss_mb_per_hour']} | "
              f"{s['uss_percent_per_hour']} | {s.get('robust_percent_per_hour', '')} | {s.get('floor_mb', '')} | "
              f"{s.get('floor_percent_per_hour', '')} | {s.get('rss_mb', '')} | "
              f"{s.get('robust_rss_percent_per_hour', '')} | {s.get('floor_rss_percent_per_hour', '')} | "
              f"{s['fds_per_hour']} | {s['threads_per_hour']} |" for s in results["slopes"]]
    bpcs = [(s["minute"], s["val_bpc"]) for s in results["samples"] if s["val_bpc"] is not None]
    lines += ["", "Validation BPC by minute: " + ", ".join(f"{mi:.0f}: {b:.3f}" for mi, b in bpcs), "",
              "A 6-hour run: `nohup python bench/soak.py --minutes 360 --json soak.json --markdown soak.md &`; "
              "`python bench/soak.py --report soak.json` prints its table while it runs."]
    write_page(path, lines)


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--minutes", type=float, default=45.0)
    parser.add_argument("--disturb-every", type=float, default=10.0, help="minutes between a restart and a freeze")
    parser.add_argument("--floor-every", type=float, default=10.0,
                        help="seconds between the reads that find each minute's least memory")
    parser.add_argument("--settle", type=float, default=10.0, help="minutes left out of the slopes")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--report", default=None, metavar="JSON", help="print the table of a run's --json")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--tracemalloc", default=None, metavar="DIR",
                        help="the coordinator and the nodes trace their Python allocations and write what grew to DIR "
                             "every --tracemalloc-every seconds (cotrain.memory.trace_allocations_from_env; it slows "
                             "them, so such a run's slopes are not the product's)")
    parser.add_argument("--tracemalloc-every", type=float, default=300.0)
    args = parser.parse_args()
    if args.tracemalloc:  # inherited by every process the swarm starts
        os.environ[TRACE_ENV] = str(Path(args.tracemalloc).resolve())
        os.environ[TRACE_EVERY_ENV] = str(args.tracemalloc_every)
    if args.report:
        results = json.loads(Path(args.report).read_text())
        results["slopes"] = slopes(results["samples"], results.get("settle", args.settle))  # by this bench's rules
        report(results)
        write_markdown(args.markdown, results)
        return 0
    with interruptible():
        results = run(args)
    results["settle"] = args.settle
    write_json(args.json, results)
    report(results)
    write_markdown(args.markdown, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
