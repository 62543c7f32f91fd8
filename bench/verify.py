"""Does the coordinator's validator catch a dishonest node, and spare the honest ones? One of five nodes attacks.

    python bench/verify.py [--attacks zero random stale scale alie equivocate] [--rounds 20] [--json FILE] [--quick]

Every row is a real swarm of a coordinator and 5 node processes on this machine, with ``verification.enabled``
(the run config's other verification settings at their defaults: each node's latest round drawn with
``sample_rate``, scored on ``score_windows`` windows at ``score_step``; heartbeats every 0.5 s, see one_row). The
swarm is byzantine.py's: the char LSTM of ``--hidden`` on tinyshakespeare, DiLoCo rounds of ``--H`` steps,
CenteredClip (the default aggregation).
One node is started with ``--attack NAME`` (:mod:`cotrain.averaging.attacks`): ``zero`` (a free rider), ``random``
(noise 10x its norm), ``stale`` (its previous round's update), ``scale`` (x10), ``sign_flip`` (x-10), ``alie``
("a little is enough": a shift below the clipping radius), ``equivocate`` (its group gets x-10, its evidence shows
the honest update: only the binding to what its reducers took in catches it), ``other_data`` (honest training on
its batches' bytes through a fixed permutation: another text than its units'). The clean row has no attacker.

While the row runs, the coordinator's health is read every second. Per row:

- ``detected_after_rounds``: the attacker's round when its first check that counts failed (null: never);
- ``suspended_after_rounds``: its round when the validator suspended it (its credential revoked, it leaves);
- ``honest_flagged`` over ``honest_node_rounds``: the honest nodes' failed checks that count, and their rounds;
- ``validator_cpu_fraction``: the validator's CPU seconds over the nodes' compute seconds (forward, backward, step);
- ``val_bpc``: the shared model the honest nodes ended with, on the whole validation split, next to the clean row's.

``--quick``: rows of 12 rounds of a 64-wide LSTM (the edit loop; its figures are not the bench's).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (bench_parser, default_text, diloco_config, final_checkpoint, print_table,  # noqa: E402
                    run_meta, work_folder, write_json, write_page)

from cotrain.cli.launch import wait_for  # noqa: E402
from cotrain.cli.local_swarm import Swarm  # noqa: E402
from cotrain.config import ATTACKS  # noqa: E402
from cotrain.evaluation import evaluate_state  # noqa: E402

VERIFY_ATTACKS = ("zero", "random", "stale", "scale", "sign_flip", "alie", "equivocate", "other_data")


def one_row(args, attack: str) -> dict:
    # a heartbeat every 0.5 s: a node offers its latest round's evidence with each heartbeat, and this small model's
    # rounds take about a second here, so at the default 2 s most rounds would never be offered (with the default
    # model's rounds of tens of seconds, every round is)
    cfg = diloco_config("verify", args, verification={"enabled": True}, coordinator={"heartbeat_interval_s": 0.5})
    names = [f"node-{i}" for i in range(args.nodes)]
    attacker = names[-1] if attack else None
    detected = suspended = None
    with work_folder("cotrain-verify-", keep=args.keep) as tmp:
        with Swarm(cfg, tmp, nodes=args.nodes) as swarm:
            started = time.monotonic()
            procs = [swarm.start_node(name, ["--wait-peers", str(args.nodes), "--max-rounds", str(args.rounds),
                                             *(["--attack", attack] if name == attacker else [])])
                     for name in names]
            while any(p.alive() for p in procs):
                if time.monotonic() - started > args.row_timeout:
                    raise RuntimeError(f"row {attack or 'clean'} ran past --row-timeout {args.row_timeout:.0f} s")
                rows = {n.node_name: n for n in swarm.health().nodes}
                if attacker in rows:
                    v, at = rows[attacker].verification, int(rows[attacker].metrics.round)
                    if detected is None and v.failed >= 1:
                        detected = at
                    if suspended is None and v.suspended:
                        suspended = at
                time.sleep(1.0)
            wall = time.monotonic() - started
            for proc in procs:
                wait_for(lambda: not proc.alive(), 60, what=f"{proc.name} to finish")
            codes = swarm.stop_nodes()
            if any(codes):
                raise RuntimeError(f"node exit codes {codes}; logs in {tmp}")
            health = swarm.health()
            rows = {n.node_name: n for n in health.nodes}
            left = {r["name"]: r for r in swarm.node_rows()}
        honest = [n for n in names if n != attacker]
        final = final_checkpoint(tmp, honest)
        bpc = evaluate_state(cfg, final.model_state())["val_bpc"]
    compute = sum(float(left[n].get("compute_s", 0.0)) for n in names if n in left)
    row = dict(attack=attack or "none", detected_after_rounds=detected, suspended_after_rounds=suspended,
               honest_flagged=sum(int(rows[n].verification.failed) for n in honest if n in rows),
               honest_node_rounds=sum(int(rows[n].metrics.rounds_completed) for n in honest if n in rows),
               honest_checks=sum(int(rows[n].verification.checks) for n in honest if n in rows),
               attacker_checks=int(rows[attacker].verification.checks) if attacker in rows else 0,
               validator_cpu_s=health.totals.validator_cpu_s, compute_s=compute,
               validator_cpu_fraction=health.totals.validator_cpu_s / compute if compute else float("nan"),
               val_bpc=bpc, wall_s=wall)
    print(f"  {row['attack']:9} detected at {detected}, suspended at {suspended}, honest flagged "
          f"{row['honest_flagged']}/{row['honest_node_rounds']} node-rounds, validator "
          f"{row['validator_cpu_fraction']:.2%} of compute, val_bpc {bpc:.4f}, {wall:.0f} s", flush=True)
    return row


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=30, help="DiLoCo rounds per row")
    parser.add_argument("--H", type=int, default=50, help="local steps per round (the run config's default)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--attacks", nargs="+", default=list(VERIFY_ATTACKS), choices=ATTACKS)
    parser.add_argument("--row-timeout", type=float, default=1800.0)
    parser.add_argument("--keep", action="store_true", help="keep each swarm's work folder (logs, state)")
    parser.add_argument("--quick", action="store_true", help="rows of 12 rounds of a 64-wide LSTM")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the figures to FILE (after every row)")
    parser.add_argument("--markdown", default=None, metavar="FILE", help="write a results page to FILE")
    parser.add_argument("--report", default=None, metavar="JSON", help="print (and --markdown) a run's figures only")
    args = parser.parse_args()
    if args.report:
        data = json.loads(Path(args.report).read_text())
        report(data, args.markdown)
        return 0
    if args.quick:
        args.rounds, args.hidden = 12, 64
    if args.nodes < 3:
        parser.error("--nodes: at least 3 (one attacker among honest peers)")
    args.data = args.data or default_text()
    print(f"verify bench: {args.nodes} nodes (1 attacker a row), {args.rounds} rounds of H={args.H}, "
          f"LSTM {args.hidden}", flush=True)
    meta = run_meta()
    runs: list[dict] = []

    def save():
        clean = next((r["val_bpc"] for r in runs if r["attack"] == "none"), float("nan"))
        for r in runs:
            r["clean_val_bpc"] = clean
        write_json(args.json, {"runs": runs, "nodes": args.nodes, "rounds": args.rounds, "H": args.H,
                               "hidden": args.hidden, "meta": meta})

    for attack in ["", *args.attacks]:
        runs.append(one_row(args, attack))
        save()
    report({"runs": runs, "nodes": args.nodes, "rounds": args.rounds, "H": args.H, "hidden": args.hidden,
            "meta": meta}, args.markdown)
    return 0


COLUMNS = ["attack", "detected at", "suspended at", "honest flagged", "honest node-rounds", "checks", "validator CPU",
           "val_bpc", "vs clean"]


def report(data: dict, markdown: str | None) -> None:
    """The table of a run's figures, and its results page (``markdown``: the command, commit, date and machine)."""
    runs = data["runs"]
    clean = next((r["val_bpc"] for r in runs if r["attack"] == "none"), float("nan"))
    rows = [[r["attack"], r["detected_after_rounds"], r["suspended_after_rounds"], r["honest_flagged"],
             r["honest_node_rounds"], r["honest_checks"] + r["attacker_checks"],
             f"{r['validator_cpu_fraction']:.2%}", round(r["val_bpc"], 4), f"{r['val_bpc'] / clean:.4f}"]
            for r in runs]
    title = f"1 attacker of {data['nodes']} nodes, {data['rounds']} rounds of H={data['H']}: what the validator caught"
    print_table(title, COLUMNS, rows)
    meta = data.get("meta", {})
    lines = [f"# Verified contributions: `bench/verify.py`, {data['nodes']} nodes, one attacker a row", "",
             f"- `{meta.get('command', '')}` at commit {meta.get('commit', '?')}, {meta.get('date', '?')}, "
             f"{meta.get('machine', '?')}, torch {meta.get('torch', '?')}", "",
             f"LSTM {data['hidden']} wide on tinyshakespeare, {data['rounds']} DiLoCo rounds of H={data['H']}, "
             "CenteredClip, `verification.enabled` with its defaults, heartbeats every 0.5 s (bench/verify.py "
             "says why). \"detected at\" and \"suspended at\" are the attacker's round at its first failed check "
             "that counts and at its suspension (null: never); \"honest flagged\" counts the honest nodes' failed "
             "checks that count, over their rounds; \"validator CPU\" is the validator's CPU seconds over the "
             "nodes' compute seconds; val_bpc is the honest nodes' final model on the whole validation split.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join("-" if v is None else str(v) for v in row) + " |" for row in rows]
    write_page(markdown, lines)


if __name__ == "__main__":
    sys.exit(main())
