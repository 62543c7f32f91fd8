"""``cotrain demo``: a whole swarm on this machine.

A coordinator and N nodes start as separate processes on 127.0.0.1, speaking gRPC and hivemind for real, and
train the run's language model together while a live table shows them. At the end the demo stops the nodes,
takes the swarm's last checkpoint, and prints its validation bits per character, a text sample and where the
checkpoint is.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import grpc

from cotrain.checkpoint import load_checkpoint
from cotrain.coordinator.store import Store
from cotrain.config import RunConfig
from cotrain.data import Corpus
from cotrain.evaluation import evaluate_model, evaluate_state, model_from_state
from cotrain.cli.launch import (LaunchError, cpu_shares, start_coordinator, start_expert_host, start_node, stop_all,
                                uninterrupted, wait_for)
from cotrain.cli.zygote import Zygote, ZygoteError
from cotrain.models import generate
from cotrain.moe.assignment import run_experts

#: the demo trains with a user's defaults (RunConfig()); it only checkpoints, and so evaluates, more often, so that the
#: dashboard's learning curve fills within the demo's minutes
DEMO_CONFIG = dict(
    run={"name": "demo"},
    coordinator={"checkpoint_interval_s": 10.0, "heartbeat_interval_s": 1.0},
)


def run_demo(args) -> int:
    from rich.console import Console
    from rich.live import Live

    from cotrain.client import CoordinatorClient
    from cotrain.status import health_table

    from cotrain.sizing import check_fleet

    console = Console()
    if args.nodes is None:
        args.nodes = 2 if args.moe else 3
    if args.nodes < 1:
        raise SystemExit("--nodes: must be >= 1")
    if args.duration <= 0:
        raise SystemExit("--duration: must be > 0")
    if not 0 <= args.moe <= 64:
        raise SystemExit(f"--moe: must be in 0..64 expert hosts, got {args.moe}")
    if args.config:
        cfg = RunConfig.load(args.config)
    else:
        source = args.data if args.data == "builtin" else str(Path(args.data).expanduser().resolve())
        cfg = RunConfig().with_overrides(data={"source": source}, **DEMO_CONFIG)
    if args.moe:  # the experts on hosts of their own, the rest in the trainers
        # a step calls its experts over the data plane, several times slower than the dense model's on 2 cores:
        # rounds of 10 steps, so that the demo's minutes hold rounds and evaluations
        cfg = cfg.with_overrides(model={"kind": "moe_lstm"}, moe={"experts": "hosted"},
                                 averaging={"inner_steps": 10})
    per_host = -(-len(run_experts(cfg.moe.grid, cfg.moe.layers)) // args.moe) if args.moe else 0
    # nodes forked from one zygote share torch's pages, so this estimate (a node as its own process) is on the safe side
    # an expert host is a process of about a node's size (its experts are a fraction of the trainers' model)
    check_fleet("--nodes and --moe" if args.moe else "--nodes", args.nodes + args.moe, cfg, args.force)
    corpus = Corpus.from_source(cfg.data.source, cfg.data.max_bytes, cfg.data.val_fraction)  # fail early, clearly
    workdir = args.workdir or Path("cotrain-demo") / time.strftime("%Y%m%d-%H%M%S")
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "run.toml"
    config_path.write_text(cfg.to_toml())

    state_dir = workdir / "coordinator"
    token = Store(state_dir).create_token(f"demo-{int(time.time())}")
    console.print(f"[bold]cotrain demo[/bold]: {args.nodes} nodes, {args.duration:.0f}s of training, "
                  f"corpus {cfg.data.source} ({corpus.size:,} bytes), work dir {workdir}" +
                  (f"; a mixture of experts on {args.moe} expert host(s) of {per_host} experts" if args.moe else ""))
    started = time.monotonic()
    coordinator, nodes, hosts, zygote, client = None, [], [], None, None
    try:
        coordinator, address = start_coordinator(state_dir, config_path, extra=["--http-port", "0"])
        dashboard = json.loads((state_dir / "coordinator.json").read_text()).get("http")
        client = CoordinatorClient(address, insecure=True, rpc_timeout=5.0)
        if args.nodes > 1 and hasattr(os, "fork"):
            # the nodes fork from one process that loaded torch and hivemind, and share that copy (~190 MB a node)
            try:
                zygote = Zygote(workdir / "zygote.log")
            except ZygoteError as e:
                console.print(f"[yellow]{e}; starting each node as its own Python[/yellow]")
        # the nodes divide this machine's CPUs (each its own, or one thread each when they outnumber them): with
        # torch's default threads every node would take every core, and they would take turns on them
        for i in range(args.moe):  # before the trainers, which skip their steps until the experts have hosts
            hosts.append(start_expert_host(address, token, f"host-{i + 1}", workdir / f"host-{i + 1}", per_host,
                                           zygote=zygote))
        for i, share in enumerate(cpu_shares(args.nodes)):
            name = f"node-{i + 1}"
            nodes.append(start_node(address, token, name, workdir / name, extra=share, zygote=zygote))
        console.print(f"coordinator at {address}; logs in {workdir}")
        if dashboard:
            console.print(f"[bold]dashboard: {dashboard}[/bold] (the learning curve and its lr, live)")
        train_started = time.monotonic()
        with Live(health_table(client.health()), console=console, refresh_per_second=2) as live:
            while time.monotonic() - train_started < args.duration:
                time.sleep(1.0)
                for proc in nodes + hosts + [coordinator]:
                    if not proc.alive():
                        raise LaunchError(f"{proc.name} exited early (code {proc.popen.returncode}); "
                                          f"see {proc.log_path}")
                try:
                    live.update(health_table(client.health()))
                except grpc.RpcError:
                    pass
        final_round = client.health().totals.global_round
        console.print(f"training time is up at round {final_round}; waiting for the checkpoint of that round")

        def checkpointed():
            totals = client.health().totals
            return totals.latest_checkpoint if totals.latest_checkpoint_round >= final_round else None

        try:
            wait_for(checkpointed, timeout=120, interval=1.0, what="the final checkpoint", procs=[coordinator])
        except LaunchError as e:
            console.print(f"[yellow]{e}; using the latest checkpoint there is[/yellow]")
        stop_all(nodes, 30)
        experts = client.health().experts  # as they were: the hosts leave next
        stop_all(hosts, 30)  # after the trainers, which call them; each checkpoints its experts as it leaves
        health = client.health()
    finally:
        # the whole clean-up is shielded: a signal while the client or the zygote closes must not skip the
        # coordinator's stop
        with uninterrupted():
            if client is not None:
                client.close()
            stop_all(nodes, 30)  # side by side, each leaving cleanly, as the coordinator goes on answering them
            stop_all(hosts, 30)
            if zygote is not None:
                zygote.close()
            if coordinator is not None:
                stop_all([coordinator], 30)
            console.print(f"stopped the coordinator ({f'pid {coordinator.pid}' if coordinator else 'not started'}) "
                          f"and {len(nodes)} node(s) ({', '.join(str(p.pid) for p in nodes) or 'none started'})" +
                          (f" and {len(hosts)} expert host(s) ({', '.join(str(p.pid) for p in hosts)})"
                           if hosts else ""))
    if args.moe:
        return moe_result(console, Store(state_dir), health, experts, started)

    checkpoint = health.totals.latest_checkpoint
    if not checkpoint:
        console.print("[red]the swarm produced no checkpoint[/red]")
        return 1
    ckpt = load_checkpoint(Path(checkpoint))
    # the run's one evaluation, over what the coordinator's covers (the first coordinator.eval_bytes of the validation
    # split), so the figure is the dashboard's for this checkpoint: of the weights the swarm started from, and of it
    initial = evaluate_state(cfg, None, corpus=corpus, max_bytes=cfg.coordinator.eval_bytes)["val_bpc"]
    model = model_from_state(cfg, ckpt.model_state())
    final = evaluate_model(cfg, model, corpus=corpus, max_bytes=cfg.coordinator.eval_bytes)["val_bpc"]
    sample = generate(model, b"\n", 300, temperature=0.8, seed=0).decode("utf-8", errors="replace")
    wall = time.monotonic() - started
    console.rule("result")
    console.print(f"rounds averaged: {ckpt.round}   samples trained on by the swarm: {ckpt.metadata.get('samples_total')}")
    console.print(f"validation bits per character: {initial:.3f} at the start -> [bold]{final:.3f}[/bold] "
                  f"(on the {corpus.val.size:,} held-out bytes)")
    console.print(f"wall time: {wall:.0f}s")
    console.print(f"checkpoint: {checkpoint}")
    console.print(f"sample (cotrain sample {checkpoint} --length 300):")
    console.print(sample, markup=False, highlight=False)
    return 0 if math.isfinite(final) and final < initial else 1


def moe_result(console, store, health, experts, started: float) -> int:
    """A hosted mixture's result: its experts left with their hosts, so the figures are the coordinator's own
    evaluations, made with the experts on their hosts."""
    evals = [e for e in store.evals() if math.isfinite(e.metrics.get("val_bpc", math.nan))]
    console.rule("result")
    if not evals:
        console.print("[red]the coordinator evaluated no checkpoint with the experts on their hosts[/red]")
        return 1
    first, last = evals[0], evals[-1]
    failed = sum(n.metrics.expert_calls_failed for n in health.nodes)
    skipped = sum(n.metrics.steps_skipped for n in health.nodes)
    console.print(f"experts: {experts.hosted} of {experts.experts} hosted by {len(experts.hosts)} host(s), "
                  f"{sum(x.forward + x.backward for h in experts.hosts for x in h.served)} calls answered; the "
                  f"trainers' calls that failed: {failed}, their steps skipped for too few experts: {skipped}")
    console.print(f"validation bits per character (the coordinator's, with the experts on their hosts): "
                  f"{first.metrics['val_bpc']:.3f} at round {first.round} -> [bold]{last.metrics['val_bpc']:.3f}"
                  f"[/bold] at round {last.round}")
    console.print(f"wall time: {time.monotonic() - started:.0f}s")
    console.print(f"checkpoint of the trainers' part: {health.totals.latest_checkpoint}; the experts' last "
                  f"checkpoints: {Path(health.totals.latest_checkpoint).parent.parent / 'experts'}")
    return 0 if last.metrics["val_bpc"] < first.metrics["val_bpc"] else 1
