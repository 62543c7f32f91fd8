"""The node's data plane coming up: its DHT peer started and registered with the coordinator, which dials it and
issues the node's data-plane credential.

A node the coordinator cannot dial (behind NAT) restarts its DHT peer in client mode, so that its peers do not waste
their rounds dialling an address nobody can reach (unless ``assume_public``: benches of what that costs the swarm).
"""

from __future__ import annotations

import logging

from hivemind.dht import DHT

from cotrain.averaging import start_dht, visible_maddrs
from cotrain.client import CoordinatorClient
from cotrain.protocol import DIAL_OUT_ONLY
from cotrain.v1 import coordinator_pb2 as pb

from cotrain.node.options import NodeOptions

# the node's log lines, under the one name its volunteer knows (as the heartbeat's)
logger = logging.getLogger("cotrain.node.runner")


def start_data_plane(client: CoordinatorClient, options: NodeOptions, initial_peers,
                     record_key) -> tuple[DHT, bool, pb.RegisterPeerResponse]:
    """Start the DHT peer (joined to ``initial_peers``, with ``options``' address and identity) and register it
    with ``record_key``'s public key. -> (the DHT peer, whether it is in client mode, the coordinator's reply: the
    credential and revocations to apply). A failed registration shuts the DHT peer down and raises."""
    identity = str(options.state_dir / "dht.key") if options.state_dir else None
    record_public = record_key.get_public_key().to_bytes()
    client_mode = options.client_mode
    while True:
        dht = start_dht(initial_peers, host=options.dht_host, port=options.dht_port, client_mode=client_mode,
                        identity_path=identity, announce=options.dht_announce)
        try:
            reply = client.register_peer(str(dht.peer_id), visible_maddrs(dht), record_public, client_mode)
        except BaseException:
            dht.shutdown()
            raise
        if reply.reachability == DIAL_OUT_ONLY and not client_mode and not options.assume_public:
            logger.warning("%s; restarting the DHT peer in client mode", reply.reason)
            dht.shutdown()
            client_mode = True
            continue
        break
    logger.info("DHT peer %s is %s: %s", str(dht.peer_id)[-8:], reply.reachability, reply.reason)
    return dht, client_mode, reply
