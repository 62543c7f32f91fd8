"""The coordinator's HTTP side (``--http-port``): the live dashboard, its JSON API and Prometheus ``/metrics``.

- ``/``: the dashboard (the learning curve: validation BPC and the lr against the swarm's samples; curves of training
  and validation loss, nodes online, throughput, bytes on the wire; a contributors leaderboard), drawn with the
  plotly.js that the plotly package ships, refreshed every 2 s; a chart with no data yet says so;
- ``/api/status``: what ``GetSwarmHealth`` returns, as JSON (``cotrain swarm status --format json`` prints the same);
- ``/api/history``: the curves, from the state dir's SQLite, so a restarted coordinator keeps them;
- ``/metrics``: the same figures for Prometheus.

It runs in a thread of its own; the swarm's state is read on the service's event loop, never concurrently.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from cotrain.status import message_to_dict
from cotrain.v1 import coordinator_pb2 as pb

from cotrain.coordinator.store import EvalRow, HistoryRow, Store

logger = logging.getLogger(__name__)

BUCKET_S = 10.0


def _finite(x) -> float | None:
    """``x`` as a float when it is a finite number, else None (NaN and inf are not JSON)."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _eval_view(e: EvalRow) -> dict:
    samples = e.metrics.get("samples_total")
    return {"t": e.time, "round": e.round, "val_loss": _finite(e.val_loss), "val_bpc": _finite(e.val_bpc),
            # the swarm's samples at the evaluated checkpoint and the schedule's lr there; None in rows from before
            "samples": int(samples) if _finite(samples) is not None else None, "lr": _finite(e.metrics.get("lr"))}


def history_view(rows: list[HistoryRow], evals: list[EvalRow], names: dict[str, str],
                 bucket_s: float = BUCKET_S, reputations: Optional[dict[str, float]] = None) -> dict:
    """The dashboard's curves from the stored history rows, as a pure function of them.

    Per node: loss over time. Per ``bucket_s`` bucket: nodes that reported, summed samples/s, and the bytes every
    node had sent and received by then (each node's latest counters, summed). Leaderboard: samples each node
    trained on, time between its first and last report, rounds it averaged. Evaluations: time, round, validation
    loss and BPC, and the swarm's samples at the checkpoint (``samples``) with the lr there (``lr``), for the
    learning curve (None where unknown, as in rows stored before they were recorded). ``reputations``
    (verification): each checked node's reputation weight, 0 once suspended; the leaderboard then ranks by verified
    samples, each node's samples times its weight (an unchecked node's count fully).
    """
    points, buckets, latest = [], {}, {}
    first_seen, last_seen, best = {}, {}, {}
    for row in rows:
        t, node, m = row.time, row.node_id, row.metrics
        loss = m.get("loss")
        points.append({"t": t, "node": node, "loss": loss if isinstance(loss, (int, float)) and math.isfinite(loss)
                       else None})
        first_seen.setdefault(node, t)
        last_seen[node] = t
        best[node] = m
        latest[node] = m
        key = math.floor(t / bucket_s) * bucket_s
        b = buckets.setdefault(key, {"t": key, "nodes": set(), "samples_per_s": defaultdict(float)})
        b["nodes"].add(node)
        b["samples_per_s"][node] = float(m.get("samples_per_s", 0.0))
        b["sent"] = sum(int(v.get("bytes_sent", 0)) for v in latest.values())
        b["received"] = sum(int(v.get("bytes_received", 0)) for v in latest.values())
    out_buckets = [{"t": b["t"], "online": len(b["nodes"]), "samples_per_s": sum(b["samples_per_s"].values()),
                    "bytes_sent": b["sent"], "bytes_received": b["received"]}
                   for _, b in sorted(buckets.items())]
    board = [{"node": n, "name": names.get(n, n[:8]), "samples": int(best[n].get("samples_local", 0)),
              "online_s": last_seen[n] - first_seen[n], "rounds": int(best[n].get("rounds_completed", 0))}
             for n in best]
    if reputations is not None:
        for c in board:
            c["verified_samples"] = int(c["samples"] * reputations.get(c["node"], 1.0))
    board.sort(key=lambda c: c.get("verified_samples", c["samples"]), reverse=True)
    return {"points": points, "buckets": out_buckets, "names": names, "leaderboard": board,
            "evals": [_eval_view(e) for e in evals]}


class SwarmCollector:
    """Prometheus collector: reads a fresh :class:`SwarmHealth` on every scrape."""

    def __init__(self, health: Callable[[], pb.SwarmHealth]):
        self.health = health

    def collect(self):
        h = self.health()
        t = h.totals
        for name, value, doc in (("nodes_online", t.nodes_online, "nodes heartbeating and training"),
                                 ("samples_per_second", t.samples_per_s, "the swarm's throughput"),
                                 ("global_round", t.global_round, "the highest averaging round reached"),
                                 ("val_loss", t.val_loss, "validation loss of the latest evaluated checkpoint"),
                                 ("val_bpc", t.val_bpc, "validation bits per character (language models)"),
                                 ("latest_checkpoint_round", t.latest_checkpoint_round, "round of the latest checkpoint"),
                                 ("epoch", t.epoch, "the current epoch of work units"),
                                 ("units_total", t.units_total, "work units per epoch"),
                                 ("units_pending", t.units_pending, "work units of the epoch not handed out"),
                                 ("units_in_progress", t.units_in_progress, "work units held by nodes"),
                                 ("units_done", t.units_done, "work units of the epoch done")):
            yield GaugeMetricFamily(f"cotrain_{name}", doc, value=float(value))
        yield CounterMetricFamily("cotrain_samples", "samples the swarm trained on", value=float(t.samples_total))
        yield CounterMetricFamily("cotrain_units_reissued", "work units reissued (holder lost or past its deadline)",
                                  value=float(t.units_reissued))
        per_node = {
            "node_loss": (GaugeMetricFamily, "training loss (moving average)", lambda m: m.loss),
            "node_samples_per_second": (GaugeMetricFamily, "samples per second", lambda m: m.samples_per_s),
            "node_step": (GaugeMetricFamily, "local steps", lambda m: m.step),
            "node_round": (GaugeMetricFamily, "averaging round", lambda m: m.round),
            "node_bytes_sent": (CounterMetricFamily, "bytes sent for averaging", lambda m: m.bytes_sent),
            "node_bytes_received": (CounterMetricFamily, "bytes received for averaging", lambda m: m.bytes_received),
            "node_partial_rounds": (CounterMetricFamily, "rounds with a missing contribution",
                                    lambda m: m.partial_rounds),
            "node_samples": (CounterMetricFamily, "samples the node trained on", lambda m: m.samples_local),
            "node_units_done": (CounterMetricFamily, "work units the node finished", lambda m: m.units_done),
            "node_refused": (CounterMetricFamily, "data-plane interactions the node refused (no valid credential)",
                             lambda m: m.refused),
        }
        for name, (family_cls, doc, get) in per_node.items():
            family = family_cls(f"cotrain_{name}", doc, labels=["node", "state"])
            for n in h.nodes:
                family.add_metric([n.node_name, n.state], float(get(n.metrics)))
            yield family
        reachable = GaugeMetricFamily("cotrain_node_dialable", "1 when the coordinator could dial the node's DHT "
                                      "address (public), 0 when it runs dial-out only", labels=["node", "state"])
        for n in h.nodes:
            if n.reachability:
                reachable.add_metric([n.node_name, n.state], float(n.reachability == "public"))
        yield reachable
        reputation = GaugeMetricFamily("cotrain_node_reputation", "verification: the weight the node's checks give it "
                                       "(1: none failed, 0: suspended)", labels=["node", "state"])
        for n in h.nodes:
            if n.HasField("verification"):
                reputation.add_metric([n.node_name, n.state],
                                      0.0 if n.verification.suspended else n.verification.reputation)
        yield reputation
        yield CounterMetricFamily("cotrain_validator_cpu_seconds", "verification: CPU seconds the coordinator's "
                                  "validator spent checking contributions", value=float(t.validator_cpu_s))
        yield GaugeMetricFamily("cotrain_alerts", "alerts in the health view (stragglers, lost nodes, refused peers)",
                                value=float(len(h.alerts)))
        if h.HasField("experts"):
            yield from _expert_metrics(h)


def _expert_metrics(h: pb.SwarmHealth):
    """A hosted mixture's experts: hosts, experts hosted, calls answered by expert and host, refusals, and the
    trainers' failed calls and skipped steps."""
    e = h.experts
    yield GaugeMetricFamily("cotrain_experts", "experts of the run's mixture layers", value=float(e.experts))
    yield GaugeMetricFamily("cotrain_experts_hosted", "experts that have a host", value=float(e.hosted))
    yield GaugeMetricFamily("cotrain_expert_hosts", "expert hosts heard from", value=float(len(e.hosts)))
    calls = CounterMetricFamily("cotrain_expert_calls", "calls an expert answered on its host since the host "
                                "started", labels=["expert", "host", "kind"])
    refused = CounterMetricFamily("cotrain_expert_host_refused", "calls an expert host refused",
                                  labels=["host"])
    for host in e.hosts:
        refused.add_metric([host.node_name], float(host.refused))
        for x in host.served:
            calls.add_metric([x.uid, host.node_name, "forward"], float(x.forward))
            calls.add_metric([x.uid, host.node_name, "backward"], float(x.backward))
    yield calls
    yield refused
    for name, doc, get in (("node_expert_calls_failed", "a trainer's expert calls that failed",
                            lambda m: m.expert_calls_failed),
                           ("node_steps_skipped", "a trainer's steps skipped for too few experts",
                            lambda m: m.steps_skipped)):
        family = CounterMetricFamily(f"cotrain_{name}", doc, labels=["node", "state"])
        for n in h.nodes:
            family.add_metric([n.node_name, n.state], float(get(n.metrics)))
        yield family


def _dashboard_html() -> bytes:
    return resources.files("cotrain.coordinator").joinpath("dashboard.html").read_bytes()


def _plotly_js() -> bytes:
    import plotly

    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()


class WebServer:
    def __init__(self, host: str, port: int, health: Callable[[], pb.SwarmHealth], store: Store):
        self.health, self.store = health, store
        self.registry = CollectorRegistry()
        self.registry.register(SwarmCollector(health))
        page, plotly_js = _dashboard_html(), _plotly_js()
        web = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt, *args):  # the dashboard polls every 2 s: keep the log quiet
                logger.debug("http: " + fmt, *args)

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store" if content_type != "text/javascript" else "max-age=3600")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path = urlparse(self.path).path
                try:
                    if path in ("/", "/index.html"):
                        self._send(200, page, "text/html; charset=utf-8")
                    elif path == "/static/plotly.min.js":
                        self._send(200, plotly_js, "text/javascript")
                    elif path == "/api/status":
                        self._send(200, json.dumps(message_to_dict(web.health())).encode(), "application/json")
                    elif path == "/api/history":
                        self._send(200, json.dumps(web.history()).encode(), "application/json")
                    elif path == "/metrics":
                        self._send(200, generate_latest(web.registry), "text/plain; version=0.0.4")
                    else:
                        self._send(404, b"not found\n", "text/plain")
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    def history(self) -> dict:
        names = {n.node_id: n.name for n in self.store.load_nodes()}
        checked = [n for n in self.health().nodes if n.HasField("verification")]
        reputations = {n.node_id: 0.0 if n.verification.suspended else n.verification.reputation for n in checked}
        return history_view(self.store.history(), self.store.evals(), names,
                            reputations=reputations if checked else None)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
