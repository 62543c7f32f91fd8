"""Only members touch the model (issue 16): rogue peers started with cotrain's own library and the run's DHT
addresses, against a real coordinator and two real nodes. None of them gets the state, gets into a group or gets
a byte of its contribution into the shared model; the members keep training and end with identical states."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cotrain.checkpoint import load_checkpoint
from cotrain.coordinator.store import Store
from cotrain.cli.launch import wait_for
from cotrain.cli.local_swarm import Swarm
from cotrain.client import CoordinatorClient
from tiny_swarm import tiny_config
from test_swarm import assert_learned

pytestmark = pytest.mark.swarm

ROGUE = Path(__file__).with_name("rogue_peer.py")
MODES = ("none", "other_key", "expired", "revoked")
ROUNDS = 14
#: seconds each member's local step takes at least: with groups formed from the progress board a round costs
#: milliseconds, and members this fast would finish their rounds before the rogues' last attempts (made up to ~30 s
#: after the revocation), leaving nobody to refuse them
STEP_DELAY = 0.3


def test_rogue_peers_get_nothing_and_members_train_on(tmp_path, corpus_file, node_zygote):
    # credentials of 10 s (the least allowed): the "expired" rogue's runs out during the test
    cfg = tiny_config(corpus_file, coordinator={"credential_ttl_s": 10.0})
    coordinator = Swarm(cfg, tmp_path, zygote=node_zygote).start()
    store = Store(coordinator.state_dir)
    tokens = {mode: store.create_token(f"mallory-{mode}") for mode in ("expired", "revoked")}
    members = [coordinator.start_node(f"member-{i}", extra=["--max-rounds", str(ROUNDS), "--threads", "1",
                                                            "--wait-peers", "2", "--step-delay", str(STEP_DELAY)])
               for i in range(2)]
    rogues, logs = {}, []
    client = CoordinatorClient(coordinator.address, insecure=True)
    try:
        for mode in MODES:
            out = tmp_path / f"rogue-{mode}.json"
            log = open(tmp_path / f"rogue-{mode}.log", "wb")
            logs.append(log)
            rogues[mode] = (subprocess.Popen(
                [sys.executable, str(ROGUE), "--coordinator", coordinator.address, "--config",
                 str(coordinator.config_path), "--mode", mode, "--out", str(out), "--go", str(tmp_path / "go"),
                 *sum((["--dht", m] for m in coordinator.info["dht"]), []),
                 *(["--token", tokens[mode]] if mode in tokens else [])],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True), out)
        wait_for(lambda: (tmp_path / "rogue-revoked.json").exists(), 120, what="the revoked rogue to register",
                 procs=[coordinator.proc])
        wait_for(lambda: all(n.metrics.round >= 2 for n in client.health().nodes if n.node_name.startswith("member"))
                 and len(client.health().nodes) >= 2, 180, what="the members to average", procs=members)
        revoked_at = time.time()
        assert store.revoke_token("mallory-revoked")
        (tmp_path / "go").write_text(str(revoked_at))
        for mode, (proc, _) in rogues.items():
            proc.wait(timeout=240)
        results = {mode: json.loads(out.read_text()) for mode, (_, out) in rogues.items()}
        # while the members train on, they report the peers they refused and the health view alerts about them
        rogue_ids = {r["peer_id"] for r in results.values()}

        def refused_peers() -> set:
            return {p for n in client.health().nodes for p in n.metrics.refused_peers}

        wait_for(lambda: rogue_ids <= refused_peers(), 30, what="the members to report the rogues they refused")
        refused, refused_alerts = refused_peers(), client.health().alerts
        assert refused_alerts, "no alert while members report refused peers"
        for member in members:
            wait_for(lambda: not member.alive(), 300, interval=0.5, what=f"{member.name} to finish")
        assert [m.stop(30) for m in members] == [0, 0], [m.log()[-3000:] for m in members]
        health = client.health()
    finally:
        client.close()
        for proc, _ in rogues.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
        for member in members:
            member.stop(10)
        coordinator.close()

    rogue_logs = {mode: (tmp_path / f"rogue-{mode}.log").read_text() for mode in MODES}
    for mode, r in results.items():
        assert not r["got_state"] and r["state_bytes"] == 0, (mode, r, rogue_logs[mode][-3000:])
        assert r["rounds_completed"] == 0 and r["averaging_bytes_received"] == 0, (mode, r)
        assert r["refusals"] > 0, (mode, r, rogue_logs[mode][-3000:])
    # the revocation list, not the credential's expiry, shut the revoked member out
    revoked = results["revoked"]
    assert revoked["all_refused"] is not None and revoked["all_refused"] < revoked["credential_expires"], revoked
    print(f"revoke -> first refused interaction: {revoked['first_refusal'] - revoked_at:.2f}s, every member "
          f"refuses: {revoked['all_refused'] - revoked_at:.2f}s (its credential had "
          f"{revoked['credential_expires'] - revoked_at:.1f}s left; {revoked['state_bytes_before_refusal']} bytes "
          f"of state served to it in between)")

    # members averaged only with each other, ended identical, and learned
    finals = [load_checkpoint(tmp_path / f"member-{i}" / "last.safetensors") for i in range(2)]
    sizes = {size for f in finals for _, size in f.metadata["rounds"]}
    assert sizes <= {1, 2} and 2 in sizes, sizes
    assert finals[0].round == finals[1].round == ROUNDS
    for name, tensor in finals[0].tensors.items():
        assert torch.equal(tensor, finals[1].tensors[name]), f"{name} differs between the members"
    assert_learned(cfg, finals[0].model_state())
    # the members named the rogues they refused
    assert {results[m]["peer_id"] for m in MODES} <= refused, (refused, refused_alerts)
    assert all(n.state == "left" for n in health.nodes if n.node_name.startswith("member"))
