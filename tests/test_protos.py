"""The committed generated code matches what grpcio-tools makes of the .proto files today."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load_generator():
    spec = importlib.util.spec_from_file_location("protogen", ROOT / "protos" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_up_to_date(tmp_path):
    _load_generator().generate(tmp_path)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert generated, "protoc produced nothing"
    committed_dir = ROOT / "src"
    for rel in generated:
        committed = committed_dir / rel
        assert committed.exists(), f"{rel} is generated but not committed: run `make protos`"
        assert committed.read_text() == (tmp_path / rel).read_text(), f"{rel} is stale: run `make protos`"


def test_every_rpc_has_typed_messages():
    from cotrain.v1 import coordinator_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Coordinator"]
    assert {m.name for m in service.methods} >= {"Join", "Heartbeat", "Leave", "GetSwarmHealth", "ReadData"}
    assert (ROOT / "src" / "cotrain" / "v1" / "coordinator_pb2.pyi").exists()
