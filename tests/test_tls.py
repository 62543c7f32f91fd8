"""TLS on the control plane: a node that verifies the coordinator's certificate joins; plaintext does not."""

import datetime
import ipaddress
import json
import subprocess
import sys

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cotrain.coordinator.store import Store
from cotrain.exit_codes import ExitCode
from cotrain.cli.launch import start_coordinator
from cotrain.protocol import PROTOCOL_VERSION
from cotrain.v1 import coordinator_pb2 as pb
from cotrain.v1 import coordinator_pb2_grpc as pb_grpc

from tiny_swarm import tiny_config

pytestmark = pytest.mark.swarm


def self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cotrain test coordinator")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_coordinator(tmp_path, corpus_file):
    cert, key = self_signed(tmp_path)
    (tmp_path / "run.toml").write_text(tiny_config(corpus_file).to_toml())
    state = tmp_path / "state"
    token = Store(state).create_token("tls")
    proc, address = start_coordinator(state, tmp_path / "run.toml", insecure=False,
                                      extra=["--tls-cert", str(cert), "--tls-key", str(key)])
    try:
        assert json.loads((state / "coordinator.json").read_text())["tls"] is True
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(address, creds) as channel:
            response = pb_grpc.CoordinatorStub(channel).Join(
                pb.JoinRequest(token=token, node_name="tls-node", protocol_version=PROTOCOL_VERSION), timeout=10)
            assert response.node_id
        with grpc.insecure_channel(address) as channel:  # plaintext to a TLS port fails
            with pytest.raises(grpc.RpcError):
                pb_grpc.CoordinatorStub(channel).GetSwarmHealth(pb.GetSwarmHealthRequest(), timeout=5)
        ok = subprocess.run([sys.executable, "-m", "cotrain.cli", "swarm", "status", address, "--ca", str(cert),
                             "--format", "json"], capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0 and json.loads(ok.stdout)["nodes"][0]["node_name"] == "tls-node", ok.stderr
        untrusted = subprocess.run([sys.executable, "-m", "cotrain.cli", "swarm", "status", address, "--format", "json"],
                                   capture_output=True, text=True, timeout=60)
        assert untrusted.returncode == ExitCode.UNAVAILABLE, untrusted.stderr  # handled, not a crash (exit 1)
    finally:
        proc.stop(30)
