"""What both sides of the control plane agree on: protocol versions, addresses, TLS channels."""

from __future__ import annotations

from pathlib import Path

import grpc

#: 2: progress records carry ``since`` (when the peer came to its round), and the board refuses records without it:
#: a node of version 1 could not publish its progress to nodes of version 2, so the coordinator does not admit it.
#: 3: a small vector's all-reduce rides with the board's meeting (a member's contribution with its meeting, the
#: host's result with its roster): a node of version 2 would neither send the one nor read the other.
#: 4: a member joins its host's meeting with one request that carries its meeting and waits for the roster
#: (``FetchRequest.deposit``); a node of version 3 would wait for the host to fetch its meeting, which no host does
#: 5: progress records carry ``contributed`` (the peer's samples in the rounds it applied: the swarm's count over
#: every group, cotrain.averaging.ledger), and the board refuses records without it
#: 6: a reduced part carries the weight its reducer credited each member's contribution with
#: (cotrain.averaging.work); a node of version 5 would read those bytes as the part's values
#: 7: a node keeps the evidence of its last rounds, names the latest in its heartbeats and uploads one when the
#: answer asks (SubmitEvidence, verification.enabled); a node of version 6 would never be checked
PROTOCOL_VERSION = 7
SUPPORTED_PROTOCOL_VERSIONS = (7,)

#: a node's reachability, as the coordinator found it when it dialled the node's DHT address (RegisterPeer)
PUBLIC, DIAL_OUT_ONLY = "public", "dial-out only"

#: gRPC message size limit on both sides (ReadData chunks stay far below it)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: largest ReadData request a node may make
MAX_READ_BYTES = 4 * 1024 * 1024

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
]


class AddressError(ValueError):
    pass


def parse_address(address: str, flag: str = "address") -> tuple[str, int]:
    """'HOST:PORT' -> (host, port), with a clear error naming the flag."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise AddressError(f"{flag}: expected HOST:PORT, got {address!r}")
    try:
        port_number = int(port)
    except ValueError:
        raise AddressError(f"{flag}: port must be a number, got {port!r}") from None
    if not 0 <= port_number <= 65535:
        raise AddressError(f"{flag}: port must be in 0..65535, got {port_number}")
    return host.strip("[]"), port_number


def open_channel(address: str, insecure: bool, ca_path: str | None = None) -> grpc.Channel:
    """A channel to the coordinator: TLS verified against ``ca_path`` (or the system roots), or plaintext."""
    parse_address(address, "COORDINATOR")
    if insecure:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    root = Path(ca_path).read_bytes() if ca_path else None
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=root), options=CHANNEL_OPTIONS)
