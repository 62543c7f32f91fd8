"""Watching a live swarm: status JSON, Prometheus /metrics, and the dashboard in a real headless browser."""

import json
import math
import os
import re
import shutil
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cotrain.cli.launch import wait_for
from cotrain.cli.local_swarm import Swarm
from cotrain.client import CoordinatorClient
from cotrain.optim.schedule import Schedule, lr_factor

from tiny_swarm import tiny_config

pytestmark = pytest.mark.swarm

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHARTS = ("curve", "loss", "val", "online", "throughput", "bytes")


@pytest.fixture(scope="module")
def live_swarm(tmp_path_factory, corpus_file, node_zygote):
    tmp = tmp_path_factory.mktemp("monitored")
    running = Swarm(tiny_config(corpus_file, averaging={"inner_steps": 30}), tmp, extra=["--http-port", "0"],
                    zygote=node_zygote).start()
    nodes = [running.start_node(name, extra=["--threads", "1", "--wait-peers", "2"])
             for name in ("alice", "bob")]
    client = CoordinatorClient(running.address, insecure=True)
    try:
        wait_for(lambda: client.health().totals.latest_checkpoint_round >= 1 and
                 all(n.metrics.rounds_completed >= 1 for n in client.health().nodes), 180,
                 what="two nodes to average and a checkpoint", procs=nodes + [running.proc])
        # the checkpoint's evaluation comes after it (on the coordinator's own thread)
        wait_for(lambda: math.isfinite(client.health().totals.val_loss), 180, what="an evaluation",
                 procs=nodes + [running.proc])
        yield running, tmp
    finally:
        client.close()
        for n in nodes:
            n.stop(30)
        running.close()


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read()


def test_status_json_of_a_live_swarm(live_swarm):
    running, _ = live_swarm
    status = json.loads(get(running.info["http"] + "/api/status"))
    assert sorted(n["node_name"] for n in status["nodes"]) == ["alice", "bob"]
    assert status["totals"]["nodes_online"] == 2
    # a node that is online is healthy or, on a loaded machine, a straggler for a moment: both are a correct swarm
    assert all(n["state"] in ("healthy", "straggler") and n["metrics"]["bytes_sent"] > 0 for n in status["nodes"])
    assert status["totals"]["val_loss"] is not None and status["totals"]["latest_checkpoint_round"] >= 1
    t = status["totals"]
    assert t["units_total"] > 0 and t["units_in_progress"] + t["units_done"] >= 2  # both nodes took work units
    assert t["units_pending"] + t["units_in_progress"] + t["units_done"] == t["units_total"]
    history = json.loads(get(running.info["http"] + "/api/history"))
    assert {c["name"] for c in history["leaderboard"]} == {"alice", "bob"}
    assert history["evals"] and history["buckets"]
    # the learning curve's points: the swarm's samples at each evaluated checkpoint, and the schedule's lr there
    cfg = running.cfg
    for e in history["evals"]:
        assert e["samples"] > 0 or e["round"] == 0, e
        assert e["lr"] == pytest.approx(cfg.optimizer.lr * lr_factor(Schedule.from_config(cfg), e["samples"]))


def test_prometheus_metrics_parse(live_swarm):
    running, _ = live_swarm
    families = {f.name: f for f in text_string_to_metric_families(get(running.info["http"] + "/metrics").decode())}
    assert families["cotrain_nodes_online"].samples[0].value == 2
    per_node = {s.labels["node"]: s.value for s in families["cotrain_node_samples_per_second"].samples}
    assert set(per_node) == {"alice", "bob"} and all(v > 0 for v in per_node.values())
    sent = {s.labels["node"]: s.value for s in families["cotrain_node_bytes_sent"].samples
            if s.name.endswith("_total")}
    assert all(v > 0 for v in sent.values())
    assert families["cotrain_val_loss"].samples[0].value > 0
    assert families["cotrain_units_total"].samples[0].value > 0


def chromium(tmp) -> list[str]:
    """Headless chromium, as the tests run it (add --dump-dom or --screenshot, and the URL)."""
    return [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp / 'chromium'}", "--window-size=1280,1600", "--virtual-time-budget=8000"]


def chart_states(dom: str) -> dict[str, str]:
    """Each chart's ``data-empty`` ("yes": it says it has no data yet), by its element id."""
    return {id_: m.group(1) if m else "" for id_ in CHARTS
            for m in [re.search(rf'<div id="{id_}"[^>]*data-empty="(\w+)"', dom)]}


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (the Makefile's test target installs it)")
def test_dashboard_renders_in_a_headless_browser(live_swarm):
    running, tmp = live_swarm
    url = running.info["http"] + "/"
    common = chromium(tmp)
    dom = subprocess.run(common + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert 'data-loaded="yes"' in dom, dom[-2000:]
    assert "alice" in dom and "bob" in dom
    assert dom.count("main-svg") >= 6  # plotly drew the charts
    # every chart has data by now, the learning curve (first) included: no "no data yet" on any of them
    assert chart_states(dom) == dict.fromkeys(CHARTS, "no"), chart_states(dom)
    assert dom.index('id="curve"') < dom.index('id="loss"')
    shot = tmp / "dashboard.png"
    subprocess.run(common + [f"--screenshot={shot}", url], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000
    target = os.environ.get("COTRAIN_ARTIFACTS")
    if target:
        os.makedirs(target, exist_ok=True)
        shutil.copy(shot, os.path.join(target, "dashboard.png"))
    print(f"dashboard screenshot: {shot}")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (the Makefile's test target installs it)")
def test_a_fresh_runs_dashboard_says_its_charts_have_no_data_yet(tmp_path, corpus_file, node_zygote):
    running = Swarm(tiny_config(corpus_file), tmp_path, extra=["--http-port", "0"], zygote=node_zygote).start()
    try:
        url = running.info["http"] + "/"
        history = json.loads(get(url + "api/history"))
        assert history["evals"] == [] and history["points"] == [] and history["buckets"] == []
        dom = subprocess.run(chromium(tmp_path) + ["--dump-dom", url], capture_output=True, text=True,
                             timeout=120).stdout
    finally:
        running.close()
    assert 'data-loaded="yes"' in dom, dom[-2000:]
    assert chart_states(dom) == dict.fromkeys(CHARTS, "yes"), chart_states(dom)
    # each chart says so in its drawing (a plotly annotation), and draws no axis (a date axis from the year 2000)
    said = re.findall(r'class="annotation-text"[^>]*>(no data yet[^<]*)<', dom)
    assert len(said) == len(CHARTS), said
    assert "the first evaluation comes after the first checkpoint" in said[0]
    assert 'class="xtick"' not in dom and 'class="ytick"' not in dom


def test_grafana_dashboard_uses_only_metrics_we_export(live_swarm):
    import re
    from pathlib import Path

    running, _ = live_swarm
    exported = {s.name for f in text_string_to_metric_families(get(running.info["http"] + "/metrics").decode())
                for s in f.samples}
    dashboard = json.loads((Path(__file__).resolve().parents[1] / "deploy" / "grafana" /
                            "cotrain-dashboard.json").read_text())
    used = {m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"cotrain_\w+", t["expr"])}
    assert used and used <= exported, used - exported
