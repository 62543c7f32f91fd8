"""``cotrain expert serve``: this machine hosts experts of a run's mixture layers (model.kind "moe_lstm", issue 56).

    cotrain expert serve COORDINATOR --token T [--experts N]

It joins the run as a node does, starts its DHT peer and registers it (the coordinator must be able to dial it:
trainers call it, so a host behind NAT is refused), and then, every few seconds, tells the coordinator how many
experts it will hold and which it holds, and serves those the answer names (:class:`cotrain.moe.host.ExpertHost`),
training each on the gradients its callers send back. Its heartbeats renew its credential and bring the revocation
list, so that a revoked member's calls are refused. SIGTERM or Ctrl-C: it leaves, and its experts go to other hosts.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
import zlib
from pathlib import Path

logger = logging.getLogger("cotrain.node.runner")

#: seconds between two reports to the coordinator: five of them fit in the pool's 15 s before a host counts as gone
REPORT_EVERY_S = 3.0
#: seconds between two checkpoints of the experts that changed: what a moved expert loses at most (its host killed)
#: against megabytes an expert uploaded that often
CHECKPOINT_EVERY_S = 30.0


def add_parser(subparsers) -> None:
    from cotrain.node.cli import add_tls_flags

    expert = subparsers.add_parser("expert", help="host experts of a run's mixture layers").add_subparsers(
        dest="expert_command", metavar="COMMAND", required=True)
    serve = expert.add_parser("serve", help="host the experts the coordinator assigns, until stopped",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("coordinator", metavar="COORDINATOR", help="the coordinator's HOST:PORT")
    serve.add_argument("--token", required=True, help="the run's join token")
    serve.add_argument("--name", default="", help="this host's name in the swarm's status (default: the hostname)")
    serve.add_argument("--experts", type=int, default=4, help="experts this machine will hold at most (default 4)")
    serve.add_argument("--state-dir", type=Path, default=None, help="keeps this host's identity across restarts")
    serve.add_argument("--checkpoint-every", type=float, default=CHECKPOINT_EVERY_S, metavar="S",
                       help=f"seconds between two checkpoints of the experts that changed, sent to the coordinator "
                            f"(default {CHECKPOINT_EVERY_S:g}): what a moved expert loses at most")
    serve.add_argument("--threads", type=int, default=1,
                       help="torch threads computing the experts' calls (default 1: calls are computed one at a "
                            "time, and a host shares its machine with a trainer or others)")
    serve.add_argument("--dht-host", default="127.0.0.1", help="the address its DHT peer listens on")
    serve.add_argument("--dht-port", type=int, default=0)
    add_tls_flags(serve)
    serve.set_defaults(handler=cmd_serve)


def cmd_serve(args) -> int:
    if not 1 <= args.experts <= 4096:
        raise SystemExit(f"--experts: must be in 1..4096, got {args.experts}")
    if not 1 <= args.threads <= 1024:
        raise SystemExit(f"--threads: must be in 1..1024, got {args.threads}")
    if not 0.5 <= args.checkpoint_every <= 86400:
        raise SystemExit(f"--checkpoint-every: must be in 0.5..86400 seconds, got {args.checkpoint_every:g}")
    import socket

    from cotrain.node.options import NodeOptions

    options = NodeOptions(coordinator=args.coordinator, token=args.token, name=args.name or socket.gethostname(),
                          insecure=args.insecure, ca=args.ca, state_dir=args.state_dir, dht_host=args.dht_host,
                          dht_port=args.dht_port)
    import torch

    torch.set_num_threads(args.threads)
    return serve(options, args.experts, args.checkpoint_every)


def serve(options, capacity: int, checkpoint_every: float = CHECKPOINT_EVERY_S) -> int:
    import torch

    from cotrain.averaging import Admission, load_record_key
    from cotrain.averaging.admission import public_key_from_bytes
    from cotrain.client import CoordinatorClient
    from cotrain.config import RunConfig
    import grpc

    from cotrain.moe.expert_state import ExpertStateError, restore_expert
    from cotrain.moe.host import ExpertHost, expert_namespace
    from cotrain.moe.mixture import FeedForward
    from cotrain.node.data_plane import start_data_plane
    from cotrain.node.heartbeat import heartbeat_loop
    from cotrain.node.identity import NodeIdentity
    from cotrain.node.report import Metrics
    from cotrain.outage import Outage
    from cotrain.v1 import coordinator_pb2 as pb

    stop, reason = threading.Event(), ["stopped"]

    def request_stop(why: str) -> None:
        reason[0] = why
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: request_stop(f"received {signal.Signals(signum).name}"))
    client = CoordinatorClient(options.coordinator, options.insecure, options.ca)
    identity = NodeIdentity(options.state_dir, options.coordinator)
    response = client.join(options.token, options.name, node_id=identity.saved_node_id())
    identity.save_node_id(response.node_id)
    cfg = RunConfig.from_toml(response.run.config_toml, origin="run config from the coordinator")
    if cfg.model.kind != "moe_lstm":
        client.leave("this run has no experts")
        raise SystemExit(f"expert serve: run {response.run.run_id} has no experts (model.kind is {cfg.model.kind!r})")
    if options.state_dir:
        options.state_dir.mkdir(parents=True, exist_ok=True)
    admission = Admission(response.run.run_id, public_key_from_bytes(response.coordinator_public_key),
                          enabled=cfg.coordinator.data_plane_auth)
    record_key = load_record_key(options.state_dir / "records.key" if options.state_dir else None)
    dht, client_mode, reply = start_data_plane(client, options, response.initial_peers, record_key)
    host = None
    try:
        if client_mode:
            raise SystemExit("expert serve: the coordinator cannot dial this machine, and trainers could not call "
                             "its experts: run it where its --dht-host and --dht-port are reachable")
        admission.set_credential(reply.credential)
        admission.apply_revocations(reply.revocations)
        threading.Thread(target=heartbeat_loop, args=(response.heartbeat_interval_s,), name="heartbeat", daemon=True,
                         kwargs=dict(stop=stop, metrics=Metrics(), report=pb.NodeMetrics, client=client,
                                     admission=admission, on_revocations=lambda: None,
                                     request_stop=request_stop)).start()
        dim, hidden = cfg.model.hidden_size, cfg.moe.expert_hidden

        def make(uid: str):
            """The expert from its last checkpoint at the coordinator, else new (the same first weights wherever
            it starts)."""
            torch.manual_seed(cfg.run.seed * 1_000_003 + zlib.crc32(uid.encode()))
            fresh = FeedForward(dim, hidden)
            try:
                data = client.load_expert(uid)
                if data is not None:
                    restored = restore_expert(data, uid, FeedForward(dim, hidden))
                    logger.info("expert %s from its checkpoint (%d updates)", uid, restored.updates)
                    return restored
            except (grpc.RpcError, ExpertStateError) as e:
                logger.warning("expert %s: its checkpoint could not be taken (%s); starting it new", uid,
                               e.details() if isinstance(e, grpc.RpcError) else e)
            return fresh

        saved: dict[str, int] = {}  # uid -> the updates of its last checkpoint sent

        def checkpoint() -> None:
            """Send the coordinator the experts held that changed since their last checkpoint."""
            for uid, updates in host.updates().items():
                if saved.get(uid) == updates:
                    continue
                data = host.checkpoint(uid)
                if data is None:
                    continue
                try:
                    client.save_expert(uid, data)
                except grpc.RpcError as e:  # moved meanwhile, or the coordinator away: the next one may do
                    uploads.failed(e, action="trying again at the next checkpoint")
                    continue
                uploads.succeeded()
                saved[uid] = updates

        host = ExpertHost(dht, expert_namespace(response.run.run_id), admission, {}, dim, lr=cfg.optimizer.lr)
        logger.info("hosting up to %d experts of run %s at peer ...%s", capacity, response.run.run_id,
                    str(dht.peer_id)[-8:])
        held: list[str] = []
        uploads = Outage("the experts' checkpoints", logger)
        last_checkpoint = time.monotonic()
        while not stop.is_set():
            try:
                answer = client.report_experts(capacity, host.holds(), give_up_after=REPORT_EVERY_S,
                                               served=host.served(), refused=host.refused)
            except Exception as e:  # noqa: BLE001 - the coordinator away: keep serving what is held
                logger.warning("could not report to the coordinator (%s); serving the experts held", e)
            else:
                if list(answer.uids) != held:
                    held = list(answer.uids)
                    for uid in host.assign(held, make):
                        saved.pop(uid, None)
                    logger.info("holding %d expert(s): %s (%s)", len(held), ", ".join(held), answer.reason)
            if time.monotonic() - last_checkpoint >= checkpoint_every:
                last_checkpoint = time.monotonic()
                checkpoint()
            stop.wait(min(REPORT_EVERY_S, checkpoint_every))
        checkpoint()  # leaving: what the experts learned goes to their next host
    finally:
        if host is not None:
            host.shutdown()
        try:
            client.leave(reason[0])
        except Exception as e:  # noqa: BLE001 - leaving is a courtesy: the pool drops a silent host in 15 s
            logger.warning("could not tell the coordinator we leave: %s", e)
        dht.shutdown()
        client.close()
    return 0
