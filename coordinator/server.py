"""``cotrain coordinator start``: the DHT bootstrap peer, the gRPC service, the checkpointer, one process."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cotrain.averaging import Admission, Exchange, ProgressBoard, start_dht, visible_maddrs
from cotrain.checkpoint import atomic_write_bytes, load_checkpoint, named_state, save_checkpoint
from cotrain.config import RunConfig
from cotrain.data import Corpus
from cotrain.data.streams import stream_ranges
from cotrain.models import build_model
from cotrain.outage import Outage
from cotrain.protocol import CHANNEL_OPTIONS, parse_address
from cotrain.warmstart import fresh_parameters, shrink_perturb
from cotrain.v1 import coordinator_pb2 as pb

from cotrain.coordinator.admission import Issuer, load_or_create_key, needs_renewal
from cotrain.coordinator.checkpointer import Checkpointer
from cotrain.coordinator.evaluator import evaluator_for
from cotrain.coordinator.expert_checkpoints import ExpertCheckpoints
from cotrain.sizing import check_fleet
from cotrain.coordinator.fleet import Fleet, FleetSizeError, ManagedNodeSpec, RayResources, ray_resources
from cotrain.coordinator.reachability import Prober
from cotrain.coordinator.service import CoordinatorService, RunInfo, SwarmSummary
from cotrain.coordinator.store import StateDirError, Store
from cotrain.moe.assignment import run_experts
from cotrain.moe.host import expert_namespace
from cotrain.moe.hosted import TrainerExperts
from cotrain.moe.mixture import FeedForward
from cotrain.coordinator.validation import Validator
from cotrain.verification.reputation import Book, ReputationError
from cotrain.coordinator.web import WebServer
from cotrain.coordinator.wire import add_service
from cotrain.coordinator.workunits import plan_ranges

logger = logging.getLogger(__name__)

#: seconds the revocation list lives on the DHT; the coordinator stores it again every quarter of that
REVOCATIONS_TTL_S = 60.0


@dataclass
class CoordinatorOptions:
    listen: str = "127.0.0.1:7450"
    state_dir: Path = Path("cotrain-state")
    dht_port: int = 0
    insecure: bool = False
    tls_cert: Optional[Path] = None
    tls_key: Optional[Path] = None
    #: port of the dashboard and /metrics (None: no HTTP server; 0: any free port)
    http_port: Optional[int] = None
    #: multiaddrs the DHT peer tells nodes instead of its listening ones (a public address)
    dht_announce: tuple = ()
    #: the operator's Ray cluster ("auto", "ray://HOST:PORT", "HOST:PORT"); None with managed_nodes > 0: a local
    #: Ray instance. With Ray, evaluations run as Ray tasks.
    ray_address: Optional[str] = None
    #: nodes to run on the Ray cluster as actors (restarted on failure), CPUs each
    managed_nodes: int = 0
    managed_node_cpus: float = 1.0
    #: the managed nodes run with ``--cpu-limit managed_node_cpus`` (enforced, where Ray only reserves)
    managed_node_cpu_limit: bool = False
    #: start the managed nodes even where they are estimated not to fit a local Ray instance's memory
    force: bool = False


def resolve_run(cfg: Optional[RunConfig], store: Store) -> tuple[str, RunConfig]:
    """The run this state dir holds; a new one is created on first start.

    Restarting with another config is refused: the nodes of a run must all train the same thing.
    """
    stored_toml, run_id = store.get_meta("config_toml"), store.get_meta("run_id")
    if stored_toml is not None and run_id is not None:
        stored = RunConfig.from_toml(stored_toml, origin=f"{store.path} (stored run config)")
        if cfg is not None and cfg != stored:
            raise StateDirError(
                f"state dir {store.state_dir} holds run {run_id} with another run config; pass the same --config, "
                f"or start a new run with another --state-dir")
        return run_id, stored
    cfg = cfg or RunConfig()
    run_id = f"{cfg.run.name}-{uuid.uuid4().hex[:8]}"
    if cfg.warm_start.checkpoint:
        warm_start_run(cfg, run_id, store)  # before the run is recorded: a bad checkpoint leaves no half-made run
    store.set_meta("config_toml", cfg.to_toml())
    store.set_meta("run_id", run_id)
    return run_id, cfg


def warm_start_run(cfg: RunConfig, run_id: str, store: Store) -> Path:
    """Round 0 of a new run from an old run's checkpoint, shrunk and perturbed; nodes fetch it as the checkpoint
    of the run when they find no peer."""
    ws = cfg.warm_start
    old = load_checkpoint(Path(ws.checkpoint).expanduser())
    model = lambda: build_model(cfg)  # noqa: E731
    noise = fresh_parameters(model, seed=cfg.run.seed + 1)
    params = shrink_perturb(old.model_state(), noise, ws.shrink, ws.perturb)
    names = list(noise)
    path = store.state_dir / "checkpoints" / "round-000000.safetensors"
    sha = save_checkpoint(path, named_state(names, [params[n] for n in names]),
                          dict(run_id=run_id, round=0, samples_total=0, strategy=cfg.averaging.strategy,
                               config_toml=cfg.to_toml(), warm_start=dict(from_checkpoint=str(ws.checkpoint),
                                                                          from_round=old.round, shrink=ws.shrink,
                                                                          perturb=ws.perturb)))
    store.add_checkpoint(0, str(path), sha, 0)
    logger.info("warm start: round 0 from %s (round %d) with shrink %.3g and perturb %.3g", ws.checkpoint, old.round,
                ws.shrink, ws.perturb)
    return path


def unit_ranges(cfg: RunConfig, corpus: Optional[Corpus]) -> list[tuple[int, int]]:
    """The work units of every epoch: byte ranges of the training split, or for world models one rollout quota
    each (``env.episodes`` rollouts from the unit's seed)."""
    if corpus is None:
        return [(i, i + 1) for i in range(cfg.coordinator.units_per_epoch)]
    min_unit = cfg.data.batch_size * (cfg.data.seq_len + 1) * 4
    return plan_ranges(corpus.train.start, corpus.train.end, cfg.coordinator.unit_bytes, min_unit)


def start_fleet(options: CoordinatorOptions, resources: RayResources) -> Fleet:
    """Start a local Ray instance of ``resources.num_cpus`` CPUs, or connect to the cluster at ``--ray-address`` and
    refuse it (:class:`FleetSizeError`) when the managed nodes cannot fit in it."""
    fleet = Fleet(options.ray_address, num_cpus=resources.num_cpus)
    if fleet.local:
        logger.info("local Ray instance of %d CPUs: %d managed node(s) of %g CPU (%g together) and evaluation tasks",
                    resources.num_cpus, options.managed_nodes, resources.share, resources.nodes_cpus)
        return fleet
    cluster, largest = fleet.cluster_cpus()
    fit = ray_resources(options.managed_nodes, options.managed_node_cpus, os.cpu_count() or 1, cluster_cpus=cluster,
                        largest_machine_cpus=largest, where=f"the Ray cluster at --ray-address {options.ray_address}")
    if fit.refusal:
        fleet.shutdown()
        raise FleetSizeError(fit.refusal)
    if fit.warning:
        logger.warning("%s", fit.warning)
    return fleet


#: the store's meta key of the validator's reputation book (cotrain.verification.reputation.Book.to_dict, JSON)
REPUTATIONS_KEY = "reputations"


def load_book(saved: Optional[str]) -> Optional[Book]:
    """The reputation book a previous coordinator of this run kept (None: none, or unreadable: logged)."""
    if not saved:
        return None
    try:
        return Book.from_dict(json.loads(saved))
    except (ValueError, ReputationError) as e:  # json's errors are ValueErrors
        logger.warning("verification: the stored reputations are unreadable (%s); starting afresh", e)
        return None


def start_validator(cfg: RunConfig, run_id: str, corpus: Optional[Corpus], ranges, units,
                    store: Optional[Store] = None) -> Optional[Validator]:
    """verification.enabled: the validator of the run's contributions, started (None: verification is off, or the
    run's model has no corpus to score on). ``ranges``: the units' byte ranges; ``units()``: the pool's units now. A
    node's data are the streams of the units it was given (a unit's streams lie across the split:
    cotrain.data.streams). ``store``: where the reputations are kept across restarts."""
    if not cfg.verification.enabled or corpus is None:
        if cfg.verification.enabled:
            logger.warning("verification: world models are not checked yet (their loss score needs rollouts)")
        return None
    split = (corpus.train.start, corpus.train.end)

    def streams(start: int, end: int) -> list[tuple[int, int]]:
        return stream_ranges(start, end, cfg.data.batch_size, split)

    def own_units(node_id: str) -> list[list[tuple[int, int]]]:
        mine = sorted((u for u in list(units()) if u.holder == node_id), key=lambda u: u.deadline, reverse=True)
        return [streams(u.start, u.end) for u in mine]

    book, save = None, None
    if store is not None:
        book = load_book(store.get_meta(REPUTATIONS_KEY))
        save = lambda data: store.set_meta(REPUTATIONS_KEY, json.dumps(data))  # noqa: E731
    validator = Validator(cfg, run_id, corpus, own_units, [streams(a, b) for a, b in ranges], book=book, save=save)
    validator.start()
    return validator


async def serve(cfg: Optional[RunConfig], options: CoordinatorOptions) -> None:
    host, port = parse_address(options.listen, "--listen")
    resources = None
    if options.ray_address or options.managed_nodes:
        # the local instance's CPUs, and a share Ray accepts; what cannot fit is refused before anything starts
        resources = ray_resources(options.managed_nodes, options.managed_node_cpus, os.cpu_count() or 1)
        if resources.refusal and (not options.ray_address or resources.share <= 0):  # a cluster: once connected
            raise FleetSizeError(resources.refusal)
    store = Store(options.state_dir)
    run_id, cfg = resolve_run(cfg, store)
    if options.managed_nodes and not options.ray_address:  # a local Ray instance: this machine's memory
        check_fleet("--managed-nodes", options.managed_nodes, cfg, options.force)
    corpus = None if cfg.model.is_world_model else Corpus.from_source(cfg.data.source, cfg.data.max_bytes,
                                                                       cfg.data.val_fraction)
    torch.set_num_threads(1)  # evaluation shares the machine with nodes; keep the coordinator light

    dht = start_dht(host=host if host not in ("0.0.0.0", "::") else "0.0.0.0", port=options.dht_port,
                    identity_path=str(options.state_dir / "dht.key"), announce=options.dht_announce)
    model = build_model(cfg)
    issuer = Issuer(load_or_create_key(options.state_dir), run_id, cfg.coordinator.credential_ttl_s, store.get_meta,
                    store.set_meta, time.time)
    # the coordinator is a member of its own run on the data plane: the checkpointer downloads the shared state
    admission = Admission(run_id, issuer.key.public_key(), enabled=cfg.coordinator.data_plane_auth)
    admission.apply_revocations(issuer.signed_revocations)
    exchange = Exchange(dht, f"{run_id}_exchange", admission)
    board = ProgressBoard(dht, run_id, ttl=3 * cfg.averaging.progress_interval + 1.0, admission=admission,
                          shards=cfg.averaging.board_shards, shard_rounds=cfg.averaging.group_rounds)
    own_credential = lambda: issuer.issue("coordinator", str(dht.peer_id), board.record_public_key,  # noqa: E731
                                          role="coordinator")
    admission.set_credential(own_credential())

    def publish_revocations(signed: bytes) -> None:
        admission.apply_revocations(signed)
        board.sync_validator()
        board.publish_revocations(signed, ttl=REVOCATIONS_TTL_S)
    summary = SwarmSummary()
    run = RunInfo(run_id, cfg.to_toml(), corpus, cfg.coordinator.heartbeat_interval_s,
                  cfg.coordinator.lost_after_missed, initial_peers=lambda: visible_maddrs(dht),
                  join_limit=(cfg.coordinator.join_rate_per_s, cfg.coordinator.join_burst),
                  heartbeat_limit=(cfg.coordinator.heartbeat_rate_per_s, cfg.coordinator.heartbeat_burst),
                  unit_ranges=unit_ranges(cfg, corpus), unit_deadline_s=cfg.coordinator.unit_deadline_s,
                  seed=cfg.run.seed, byte_counts=corpus.byte_counts() if corpus is not None else [],
                  forget_after_s=cfg.coordinator.forget_after_s,
                  experts=run_experts(cfg.moe.grid, cfg.moe.layers) if cfg.hosts_experts else [])
    prober = Prober()
    validator = start_validator(cfg, run_id, corpus, run.unit_ranges, lambda: service.units.units.values(), store)
    checkpoints = None
    if cfg.hosts_experts:
        checkpoints = ExpertCheckpoints(options.state_dir / "experts", run.experts,
                                        lambda: FeedForward(cfg.model.hidden_size, cfg.moe.expert_hidden))
    service = CoordinatorService(store, run, summary, issuer, prober, publish_revocations, validator=validator,
                                 expert_checkpoints=checkpoints)
    fleet = None if resources is None else start_fleet(options, resources)
    experts = None
    if cfg.hosts_experts:  # the coordinator evaluates the mixture with its experts on their hosts
        experts = TrainerExperts(dht, expert_namespace(run_id), admission, cfg.moe.layers, cfg.moe.grid,
                                 service.experts.directory, cfg.moe.timeout_s, cfg.moe.down_s)
    checkpointer = Checkpointer(cfg, run_id, model, exchange, board, store, summary,
                                evaluator_for(cfg, fleet, corpus=corpus, experts=experts))

    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    # every RPC of the proto, with malformed requests answered INVALID_ARGUMENT before the service sees them
    add_service(server, service, pb.DESCRIPTOR.services_by_name["Coordinator"])
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if options.insecure:
        bound = server.add_insecure_port(options.listen)
    else:
        creds = grpc.ssl_server_credentials([(options.tls_key.read_bytes(), options.tls_cert.read_bytes())])
        bound = server.add_secure_port(options.listen, creds)
    if bound == 0:
        raise OSError(f"--listen: cannot bind {options.listen}")
    await server.start()
    await health_servicer.set("cotrain.v1.Coordinator", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    checkpointer.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def snapshot():
        return service.health()

    async def every_second(what: str, step) -> None:
        """Run ``step()`` on the service's event loop every second until cancelled; a failure is logged once per
        outage (and a reminder a minute), and the next tick tries again."""
        failures = Outage(what, logger)
        while True:
            try:
                step()
                failures.succeeded()
            except (sqlite3.Error, OSError, EOFError) as e:  # a busy or full store, the DHT process gone
                failures.failed(e)
            except Exception as e:  # noqa: BLE001 - a bug: logged with its traceback; the coordinator serves on
                failures.failed(e, expected=False)
            await asyncio.sleep(1.0)

    issued, published = time.time(), 0.0

    def admission_step() -> None:
        """Apply the operator's token revocations; keep the revocation list on the DHT and the coordinator's own
        credential fresh."""
        nonlocal issued, published
        now = time.time()
        if service.apply_revocations():  # published on the DHT by the service already
            published = now
        elif now - published >= REVOCATIONS_TTL_S / 4:
            board.publish_revocations(issuer.signed_revocations, ttl=REVOCATIONS_TTL_S)
            published = now
        if needs_renewal(issued, now, issuer.ttl):
            admission.set_credential(own_credential())
            issued = now

    # the service's periodic work: the health view only reads, so lost nodes' and late units go back to the pool here
    tickers = [asyncio.ensure_future(every_second("admission tick", admission_step)),
               asyncio.ensure_future(every_second("reclaiming work units", service.reclaim)),
               asyncio.ensure_future(every_second("forgetting departed nodes", service.forget_departed))]

    web, managed_token = None, None
    try:
        if options.http_port is not None:
            web = WebServer(host, options.http_port,
                            lambda: asyncio.run_coroutine_threadsafe(snapshot(), loop).result(timeout=10), store)
            web.start()
        address = f"{host}:{bound}"
        managed_pids = []
        if fleet is not None and options.managed_nodes:
            managed_token = f"managed-{uuid.uuid4().hex[:8]}"
            dial = f"{fleet.ray.util.get_node_ip_address() if host in ('0.0.0.0', '::') else host}:{bound}"
            spec = ManagedNodeSpec(dial, store.create_token(managed_token), options.state_dir / "managed",
                                   options.insecure, ca=str(options.tls_cert) if options.tls_cert else None,
                                   cpus_per_node=resources.share,
                                   extra_args=(("--cpu-limit", f"{resources.share:g}")
                                               if options.managed_node_cpu_limit else ()))
            # off the event loop: the gRPC server keeps answering (the nodes join while they start); a SIGTERM
            # meanwhile stops the coordinator at once, not after the start-up (the fleet's shutdown ends it)
            starting = asyncio.ensure_future(asyncio.to_thread(fleet.start_nodes, options.managed_nodes, spec))
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                logger.info("stopping while the managed nodes start")
                starting.add_done_callback(lambda f: f.cancelled() or f.exception())  # its failure is expected
                return
            stopping.cancel()
            starting.result()
            managed_pids = await asyncio.to_thread(fleet.node_pids)
        info = dict(address=address, run_id=run_id, dht=visible_maddrs(dht), tls=not options.insecure,
                    http=f"http://{host}:{web.port}" if web else None,
                    ray=None if fleet is None else ("local" if fleet.local else options.ray_address),
                    managed_pids=managed_pids)
        atomic_write_bytes(options.state_dir / "coordinator.json", json.dumps(info, indent=1).encode())
        logger.info("coordinator of run %s listening on %s (%s); DHT at %s", run_id, address,
                    "plaintext" if options.insecure else "TLS", " ".join(info["dht"]))
        print(f"coordinator listening on {address} run={run_id}" + (f" dashboard {info['http']}" if web else ""),
              flush=True)
        await stop.wait()
    finally:
        logger.info("coordinator shutting down")
        began = time.monotonic()
        for ticker in tickers:
            ticker.cancel()
        # side by side: each may take seconds (the fleet's nodes up to 30 s). A checkpoint being written is
        # finished or abandoned atomically (save_checkpoint writes a temporary file and renames it); an evaluation
        # still on Ray when the fleet closes is not recorded. The fleet goes while the gRPC server still answers:
        # managed nodes leave cleanly
        checkpointer.stop()
        steps = {"the reachability prober": prober.shutdown(),
                 "the checkpointer": asyncio.to_thread(checkpointer.join, 30)}
        if web is not None:
            steps["the dashboard"] = asyncio.to_thread(web.stop)
        if validator is not None:
            validator.stop()
            steps["the validator"] = asyncio.to_thread(validator.join, 10)
        if fleet is not None:
            steps["the managed nodes and Ray"] = asyncio.to_thread(fleet.shutdown)
        for what, outcome in zip(steps, await asyncio.gather(*steps.values(), return_exceptions=True)):
            if isinstance(outcome, BaseException):
                logger.warning("stopping %s failed: %r", what, outcome)
        if managed_token is not None:
            store.revoke_token(managed_token)
        await health_servicer.enter_graceful_shutdown()
        await server.stop(grace=2.0)
        exchange.shutdown(linger_s=0)
        if experts is not None:
            experts.shutdown()
        dht.shutdown()
        store.close()
        (options.state_dir / "coordinator.json").unlink(missing_ok=True)
        logger.info("coordinator stopped in %.1fs: %s, the gRPC server, the DHT and the store",
                    time.monotonic() - began, ", ".join(steps))

