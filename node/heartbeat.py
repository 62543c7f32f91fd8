"""The node's heartbeat: every ``heartbeat_interval_s`` it sends its figures to the coordinator and takes back its
renewed credential, the revocations and the coordinator's command; every FOOTPRINT_EVERY_S it measures the memory
its processes use. The coordinator being away costs nothing but a log line: the swarm does not need it to train."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable

import grpc

from cotrain.averaging import Admission
from cotrain.footprint import footprint
from cotrain.outage import Outage
from cotrain.v1 import coordinator_pb2 as pb

from cotrain.node.report import Metrics

logger = logging.getLogger("cotrain.node.runner")

#: seconds between two measures of what the node's processes cost: the heartbeat reports the last one, and
#: --max-memory is checked against it. Reading the smaps of the node's processes takes 10-20 ms of a core (py-spy,
#: 3 nodes on 2 cores: 1.3% of a node's samples when measured every 5 s); memory moves slowly
FOOTPRINT_EVERY_S = 15.0


def heartbeat_loop(interval: float, *, stop: threading.Event, metrics: Metrics, report: Callable[[], pb.NodeMetrics],
                   client, admission: Admission, on_revocations: Callable[[], None],
                   request_stop: Callable[[str], None], max_memory: int = 0, evidence=None) -> None:
    """Until ``stop``: a heartbeat every ``interval`` seconds with ``report()``. It asks the node to stop
    (``request_stop``) when the coordinator says drain, when it no longer knows this node, and when the node's
    processes use more than ``max_memory`` bytes (0: no limit); ``on_revocations``: the revocations it got changed
    what this node knows; ``evidence``: this node's EvidenceKeeper (verification.enabled), whose latest round each
    heartbeat names and whose evidence it uploads when the answer asks (None: none kept)."""
    outage = Outage("heartbeat", logger)
    measured = -math.inf
    while not stop.wait(interval):
        if time.monotonic() - measured >= FOOTPRINT_EVERY_S:
            measured, used = time.monotonic(), footprint()
            with metrics.lock:
                metrics.footprint = used
            if max_memory and used.pss_bytes > max_memory:
                request_stop(f"using {used.pss_bytes / 2**20:.0f} MiB in {used.processes} processes, more "
                             f"than --max-memory {max_memory / 2**20:.0f} MiB")
                break
        try:
            sent = time.monotonic()
            if evidence is not None:
                response = client.heartbeat(report(), evidence.latest(), evidence.commitments(),
                                            evidence.parts_seen())
            else:
                response = client.heartbeat(report())
            with metrics.lock:
                metrics.heartbeat_ms = (time.monotonic() - sent) * 1e3
        except grpc.RpcError as e:  # keep training while the coordinator is away; the swarm does not need it
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:  # it forgot this node after a long absence
                request_stop(f"the coordinator no longer knows this node's session ({e.details()}); "
                             "run `cotrain node join` again")
                break
            outage.failed(e, action="training on and retrying")
            continue
        except Exception as e:  # noqa: BLE001 - a bug here must not stop training: logged with its traceback
            outage.failed(e, expected=False, action="training on and retrying")
            continue
        outage.succeeded()
        admission.set_credential(response.credential)
        if admission.apply_revocations(response.revocations):
            on_revocations()
        if evidence is not None and response.evidence_round:
            upload_evidence(client, evidence, response.evidence_round, outage)
        if response.command == pb.DRAIN:
            request_stop(f"coordinator asked to drain: {response.reason}")


def upload_evidence(client, evidence, round_number: int, outage: Outage) -> None:
    """Send the evidence of ``round_number`` the coordinator asked for (nothing when it is no longer kept)."""
    data = evidence.encoded(round_number)
    if data is None:
        return
    try:
        answer = client.submit_evidence(round_number, data)
    except grpc.RpcError as e:  # the validator asks again for a later round
        outage.failed(e, action="training on")
        return
    if not answer.accepted:
        logger.info("the coordinator did not take the evidence of round %d: %s", round_number, answer.reason)
