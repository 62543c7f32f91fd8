"""A rogue peer for tests/test_rogue_peers.py: cotrain's own library, the run's DHT addresses, and no valid
credential. It tries what issue 16 found a former member could do: download the shared state, get into a round's
group, and have a x10-scaled contribution averaged into the members' model.

    python tests/rogue_peer.py --coordinator HOST:PORT --config run.toml --dht MADDR --mode MODE --out result.json

Modes: ``none`` (never had a token: no credential), ``other_key`` (a credential it signed itself), ``expired`` (joins
with a token, registers, never heartbeats, and acts once its credential expired), ``revoked`` (joins and registers,
writes ``registered`` to --out, waits for the file --go, whose content is the time the operator revoked its token,
then acts). The result (what it got, when it was first refused) goes to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
import uuid

import torch
from hivemind.p2p import PeerID

from cotrain.averaging import Admission, Verdict, build_strategy, download_state, load_record_key, start_dht, visible_maddrs
from cotrain.averaging.admission import issue_credential, new_private_key, parse_credential, public_key_from_bytes
from cotrain.averaging.state import STATE_KEY
from cotrain.config import RunConfig
from cotrain.client import CoordinatorClient
from cotrain.tasks import build_task
from cotrain.v1 import coordinator_pb2 as pb


class MembersOnly(Admission):
    """The rogue's own gate: it deals with the run's members only (the other rogues of the test are not its
    targets). It checks no credential: it learned the members' peer ids from the public health view."""

    def __init__(self, run_id: str, credential: bytes):
        super().__init__(run_id, None, credential=credential, enabled=False)
        self.members: set[str] = set()

    def verify(self, credential, peer_id, record_public_key=None):
        return Verdict(peer_id in self.members, "member" if peer_id in self.members else "not a member")


def write(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--dht", action="append", required=True)
    parser.add_argument("--mode", choices=("none", "other_key", "expired", "revoked"), required=True)
    parser.add_argument("--token", default="")
    parser.add_argument("--out", required=True)
    parser.add_argument("--go", default="")
    parser.add_argument("--attempts", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rogue %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)

    cfg = RunConfig.load(args.config)
    client = CoordinatorClient(args.coordinator, insecure=True)
    run_id = client.health().run_id  # anyone may watch a swarm
    coordinator_key = None
    if args.token:
        joined = client.join(args.token, f"rogue-{args.mode}")
        coordinator_key = joined.coordinator_public_key
    record_key = load_record_key(None)
    dht = start_dht(args.dht)
    peer_id = str(dht.peer_id)
    deadline = time.time() + 150
    while time.time() < deadline:  # until the members have averaged a round: there is a model to steal
        nodes = [n for n in client.health().nodes if n.metrics.peer_id and n.metrics.round >= 1]
        if len(nodes) >= 2:
            break
        time.sleep(0.2)
    member_ids = {n.metrics.peer_id for n in nodes}
    credential, expires = b"", 0.0
    admission = MembersOnly(run_id, b"")
    if args.mode == "other_key":
        credential = issue_credential(new_private_key(), run_id=run_id, node_id=uuid.uuid4().hex, peer_id=peer_id,
                                      record_public_key=record_key.get_public_key().to_bytes(), role="node",
                                      now=time.time(), ttl=3600)
    elif args.mode in ("expired", "revoked"):
        reply = client.register_peer(peer_id, visible_maddrs(dht), record_key.get_public_key().to_bytes(), False)
        credential = reply.credential
        expires = parse_credential(credential, public_key_from_bytes(coordinator_key)).expires_unix
    admission.set_credential(credential)
    if args.mode == "revoked":  # a member in good standing until its token is revoked: it renews its credential
        def renew():
            while True:
                try:
                    reply = client.heartbeat(pb.NodeMetrics(step=1))
                    admission.set_credential(reply.credential)
                except Exception as e:  # noqa: BLE001 - the test ends it
                    logging.info("heartbeat: %r", e)
                time.sleep(0.5)

        threading.Thread(target=renew, daemon=True).start()
    result = dict(mode=args.mode, peer_id=peer_id, credential_expires=expires, got_state=False, state_bytes=0,
                  rounds_completed=0, averaging_bytes_received=0, refusals=0, first_refusal=None,
                  state_bytes_before_refusal=0)

    task = build_task(cfg)
    model = task.build_model(None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr)
    admission.members = member_ids
    strategy = build_strategy(model, optimizer, dht, run_id, cfg, peer_id=peer_id, admission=admission,
                              attack="scale")
    strategy.phase = "paused"  # while it waits, members need not wait for it
    exchange = strategy.exchange
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            members = [p for p in strategy.view.peers if p.peer_id in member_ids]
            if members:
                break
            time.sleep(0.2)
        logging.info("rogue %s sees %d members", args.mode, len(members))
        if args.mode == "revoked":
            write(args.out, dict(result, registered=True))
            while not os.path.exists(args.go):
                time.sleep(0.05)
            # ask a member for the state until it refuses: how long the revocation took to reach the members
            expires = parse_credential(admission.credential(), public_key_from_bytes(coordinator_key)).expires_unix
            result["credential_expires"] = expires
            pending = {p.peer_id for p in members}
            deadline = time.time() + 2 * cfg.coordinator.credential_ttl_s
            while pending and time.time() < deadline:
                for member in sorted(pending):
                    before = exchange.refusals_received
                    data = exchange.fetch(PeerID.from_base58(member), STATE_KEY, wait_s=0.0, timeout=10.0, state=True)
                    if exchange.refusals_received > before:
                        result["first_refusal"] = result["first_refusal"] or time.time()
                        pending.discard(member)
                    result["state_bytes_before_refusal"] += len(data or b"")
                time.sleep(0.05)
            result["all_refused"] = None if pending else time.time()
        elif args.mode == "expired":
            time.sleep(max(0.0, expires - time.time() + 1.0))
        state_bytes_before = exchange.state_bytes_received  # the state it is to get now, not before its refusal
        strategy.phase = "train"
        result["got_state"] = download_state(exchange, members, timeout=10.0, run_id=run_id) is not None
        for _ in range(args.attempts):
            members = [p for p in strategy.view.peers if p.peer_id in admission.members]
            if not members:
                break
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p))  # a large contribution, then scaled x10 by the attack
            strategy.at.round = max(p.round for p in members)
            strategy.at.steps = strategy.at.samples = cfg.averaging.inner_steps
            strategy._average_with_group(strategy.strategy.contribution(), seen=len(members) + 1)
        result["refusals"] = exchange.refusals_received
        if result["first_refusal"] is None and exchange.refusals_received:
            result["first_refusal"] = time.time()
        result["state_bytes"] = exchange.state_bytes_received - state_bytes_before
        result["averaging_bytes_received"] = exchange.bytes_received
        result["rounds_completed"] = strategy.stats.rounds_completed
    finally:
        write(args.out, result)
        strategy.shutdown()
        dht.shutdown()
        client.close()


if __name__ == "__main__":
    main()
