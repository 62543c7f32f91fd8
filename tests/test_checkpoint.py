import pytest
import torch

from cotrain.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def test_round_trip_with_metadata(tmp_path):
    path = tmp_path / "c.safetensors"
    tensors = {"model.w": torch.randn(3, 4), "outer_momentum.w": torch.zeros(3, 4)}
    sha = save_checkpoint(path, tensors, {"round": 7, "config_toml": "x = 1\n"})
    ckpt = load_checkpoint(path)
    assert ckpt.round == 7 and torch.equal(ckpt.tensors["model.w"], tensors["model.w"])
    assert list(ckpt.model_state()) == ["w"]
    assert load_checkpoint(path, expected_sha256=sha).round == 7
    assert not list(tmp_path.glob("*.tmp"))  # no temporary file left behind


def test_corruption_is_detected(tmp_path):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, {"model.w": torch.ones(100)}, {"round": 1, "config_toml": ""})
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"hello")
    with pytest.raises(CheckpointError):
        load_checkpoint(path)
