"""What does data-plane admission cost? Rounds per second of a swarm with and without the credential checks.

    python bench/admission.py [--nodes 3] [--rounds 20] [--H 10] [--repeats 2] [--json FILE]

Every run is a real swarm of coordinator and node processes on this machine (1 torch thread per node) training the
same small char LSTM on the same data (tinyshakespeare) for the same number of DiLoCo rounds per node. The runs
alternate ``coordinator.data_plane_auth = true`` (every all-reduce piece fetch, state download, group membership
and progress record is checked against a coordinator-signed Ed25519 credential) and ``false`` (every check passes
unexamined), ``--repeats`` times each (on, off, on, off, ...), so that the machine's own noise shows next to any
difference.

Per run: the round every node reached (a node leaves at ``--rounds``) and how many of them every node averaged
with peers itself (one that fell behind downloads the shared state instead; "state bytes" counts all the nodes'
state downloads, at start-up too), the swarm's wall seconds (processes started to all nodes gone, including start-up
and joining), each node's training seconds (its first step to its leaving, as the node reports it), rounds per
second (rounds reached over training seconds, averaged over the nodes), seconds per round, averaging bytes each node
sent, partial rounds and refused interactions (both should be 0 in a clean swarm). ``overhead`` is the mean seconds
per round with the checks over the mean without (1.0: no cost; above 1: slower with them).

A second table times one check in-process with timeit: ``Admission.verify`` on a credential it has not seen (an
Ed25519 signature verification and a protobuf parse), on one it has (a SHA-256 of the bytes and a cache lookup),
with the checks off, and the bare Ed25519 verification.
"""

from __future__ import annotations

import statistics
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import bench_parser, default_text, diloco_config, print_table, run_swarm, write_json  # noqa: E402

from cotrain.averaging.admission import (  # noqa: E402
    CREDENTIAL_DOMAIN, Admission, issue_credential, new_private_key)
from cotrain.v1 import swarm_pb2 as pb  # noqa: E402


def one_run(args, auth: bool) -> dict:
    cfg = diloco_config("admission", args, coordinator={"data_plane_auth": auth})
    run = run_swarm(cfg, args.nodes, ["--max-rounds", str(args.rounds)], evaluate=False)
    nodes = run.nodes
    rounds = [int(n.get("round", 0)) for n in nodes]  # the round each node reached (it leaves at --rounds)
    averaged = [int(n.get("rounds_completed", 0)) for n in nodes]  # of which it averaged with peers itself
    train_s = [float(n.get("wall_s", 0.0)) for n in nodes]
    per_node_rps = [r / s for r, s in zip(rounds, train_s) if s > 0]
    rps = statistics.fmean(per_node_rps) if per_node_rps else 0.0
    row = dict(auth=auth, rounds=min(rounds) if rounds else 0, rounds_per_node=rounds,
               averaged=min(averaged) if averaged else 0, averaged_per_node=averaged, wall_s=run.wall_s,
               train_s=statistics.fmean(train_s) if train_s else 0.0, rounds_per_s=rps,
               s_per_round=1.0 / rps if rps > 0 else float("nan"),
               bytes_per_node=statistics.fmean(int(n.get("bytes_sent", 0)) for n in nodes) if nodes else 0.0,
               state_bytes=sum(int(n.get("state_bytes_received", 0)) for n in nodes),
               partial_rounds=sum(int(n.get("partial_rounds", 0)) for n in nodes),
               refused=sum(int(n.get("refused", 0)) for n in nodes))
    print(f"  auth {'on ' if auth else 'off'} rounds {row['rounds']:>3} (averaged {row['averaged']:>3}) "
          f"wall {row['wall_s']:6.1f}s train {row['train_s']:6.1f}s {row['rounds_per_s']:.3f} rounds/s "
          f"bytes/node {row['bytes_per_node']:>11,.0f} state {row['state_bytes']:,} partial {row['partial_rounds']} "
          f"refused {row['refused']}", flush=True)
    return row


def check_costs(number: int) -> dict:
    """Microseconds per ``Admission.verify`` call: fresh credentials (signature checked), a cached one, checks off,
    and the bare Ed25519 verification."""
    key = new_private_key()
    run_id, peer_id, now = "bench-run", "12D3KooWBenchPeer", time.time()

    def credential(i: int) -> bytes:
        return issue_credential(key, run_id=run_id, node_id=f"node-{i}", peer_id=peer_id, record_public_key=b"k" * 32,
                                role="node", now=now, ttl=3600.0)

    fresh = [credential(i) for i in range(min(number, Admission.CACHE_SIZE))]  # distinct bytes: each one a miss
    gate = Admission(run_id, key.public_key(), clock=lambda: now)
    assert gate.verify(fresh[0], peer_id).ok, "a freshly issued credential must verify"

    def time_fresh() -> float:
        admission = Admission(run_id, key.public_key(), clock=lambda: now)  # empty cache
        it = iter(fresh)
        return timeit.timeit(lambda: admission.verify(next(it), peer_id), number=len(fresh)) / len(fresh)

    cached = fresh[0]
    off = Admission(run_id, None, enabled=False)
    signed = pb.SignedCredential.FromString(cached)
    message, public = CREDENTIAL_DOMAIN + signed.body, key.public_key()
    best = lambda f: min(f() for _ in range(3)) * 1e6  # noqa: E731 - best of 3 repeats, in microseconds
    return {
        "verify_fresh_us": best(time_fresh),
        "verify_cached_us": best(lambda: timeit.timeit(lambda: gate.verify(cached, peer_id), number=number) / number),
        "verify_off_us": best(lambda: timeit.timeit(lambda: off.verify(cached, peer_id), number=number) / number),
        "ed25519_verify_us": best(lambda: timeit.timeit(lambda: public.verify(signed.signature, message),
                                                        number=number) / number),
        "credential_bytes": len(cached),
    }


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20, help="DiLoCo rounds per node and run")
    parser.add_argument("--H", type=int, default=10, help="local steps per round")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="runs with the checks on, and as many with them off")
    parser.add_argument("--checks", type=int, default=2000, help="verify calls per timeit measurement")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the figures to FILE")
    args = parser.parse_args()
    if args.nodes < 2 or args.rounds < 1 or args.H < 1 or args.repeats < 1 or args.checks < 1:
        parser.error("--nodes at least 2; --rounds, --H, --repeats and --checks at least 1")
    args.data = args.data or default_text()

    print(f"admission bench: {args.nodes} nodes, {args.rounds} rounds of H={args.H}, LSTM 1x{args.hidden}, "
          f"data_plane_auth on/off x{args.repeats}", flush=True)
    started = time.monotonic()
    runs = [one_run(args, auth) for _ in range(args.repeats) for auth in (True, False)]

    def mean(auth: bool, key: str) -> float:
        return statistics.fmean(r[key] for r in runs if r["auth"] == auth)

    s_on, s_off = mean(True, "s_per_round"), mean(False, "s_per_round")
    overhead = s_on / s_off
    rows = [[i + 1, "on" if r["auth"] else "off", r["rounds"], r["averaged"], r["wall_s"], r["train_s"],
             r["rounds_per_s"], r["s_per_round"], r["bytes_per_node"], r["state_bytes"], r["partial_rounds"],
             r["refused"]] for i, r in enumerate(runs)]
    for auth in (True, False):
        rows.append(["mean", "on" if auth else "off", mean(auth, "rounds"), mean(auth, "averaged"),
                     mean(auth, "wall_s"), mean(auth, "train_s"), mean(auth, "rounds_per_s"),
                     mean(auth, "s_per_round"), mean(auth, "bytes_per_node"), "", "", ""])
    ratio = lambda key: mean(True, key) / max(1e-9, mean(False, key))  # noqa: E731
    rows.append(["on/off", "", "", "", ratio("wall_s"), ratio("train_s"), ratio("rounds_per_s"), overhead,
                 ratio("bytes_per_node"), "", "", ""])
    print_table(f"data-plane admission: {args.nodes} nodes, {args.rounds} rounds of H={args.H} per run "
                "(rounds: reached by every node; averaged: of them, averaged with peers by every node)",
                ["run", "auth", "rounds", "averaged", "wall s", "train s", "rounds/s", "s/round", "bytes/node",
                 "state bytes", "partial", "refused"], rows)
    spread = {auth: [r["s_per_round"] for r in runs if r["auth"] == auth] for auth in (True, False)}
    print(f"\noverhead (s/round with checks / without): {overhead:.3f}; s/round with checks "
          f"{min(spread[True]):.3f}-{max(spread[True]):.3f}, without {min(spread[False]):.3f}-{max(spread[False]):.3f}")

    costs = check_costs(args.checks)
    print_table("one credential check (Admission.verify, in-process, best of 3)", ["check", "us per call"],
                [["fresh credential (Ed25519 + parse)", costs["verify_fresh_us"]],
                 ["cached credential (SHA-256 + lookup)", costs["verify_cached_us"]],
                 ["checks off", costs["verify_off_us"]],
                 ["bare Ed25519 verify", costs["ed25519_verify_us"]]])
    print(f"\na credential is {costs['credential_bytes']} bytes; one round ({s_off:.3f}s without checks) "
          f"has room for {0.01 * s_off / (costs['verify_fresh_us'] * 1e-6):,.0f} fresh checks per 1% of its time")
    print(f"bench took {time.monotonic() - started:.0f}s", flush=True)
    write_json(args.json, {
        "nodes": args.nodes, "rounds": args.rounds, "H": args.H, "hidden": args.hidden,
        "runs": runs,
        "mean": {("on" if auth else "off"): {k: mean(auth, k) for k in ("wall_s", "train_s", "rounds_per_s",
                                                                         "s_per_round", "bytes_per_node")}
                 for auth in (True, False)},
        "overhead": overhead,
        "check_cost": costs,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
