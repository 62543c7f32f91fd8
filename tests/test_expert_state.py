"""An expert's checkpoint (cotrain.moe.expert_state) and the coordinator's keeping of them
(coordinator/expert_checkpoints): a restored expert goes on exactly as the one saved would have; bytes that are not
the run's expert are refused naming the field; only the run's experts are files."""

import pytest
import torch

from cotrain.checkpoint import decode_checkpoint, encode_checkpoint
from cotrain.coordinator.expert_checkpoints import ExpertCheckpoints
from cotrain.moe.expert_state import ExpertStateError, encode_expert, load_optimizer_state, restore_expert
from cotrain.moe.mixture import FeedForward

UID = "moe0.1.0"


def trained(steps: int):
    torch.manual_seed(0)
    expert = FeedForward(8, 16)
    optimizer = torch.optim.AdamW(expert.parameters(), lr=1e-2)
    for _ in range(steps):
        expert(torch.randn(4, 3, 8)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return expert, optimizer


def step(expert, optimizer, x):
    expert(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    return [p.detach().clone() for p in expert.parameters()]


@pytest.mark.parametrize("steps", [0, 5])
def test_a_restored_expert_goes_on_as_the_saved_one_would(steps):
    expert, optimizer = trained(steps)
    restored = restore_expert(encode_expert(UID, expert, optimizer), UID, FeedForward(8, 16))
    assert restored.updates == steps
    again = torch.optim.AdamW(restored.module.parameters(), lr=1e-2)
    load_optimizer_state(again, restored)
    x = torch.randn(4, 3, 8)
    for a, b in zip(step(expert, optimizer, x), step(restored.module, again, x)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def bad(kind: str) -> bytes:
    expert, optimizer = trained(2)
    if kind == "garbage":
        return b"\x00" * 100
    if kind == "uid":
        return encode_expert("moe0.0.0", expert, optimizer)
    if kind == "shape":
        other = FeedForward(8, 32)
        return encode_expert(UID, other, torch.optim.AdamW(other.parameters()))
    tensors = decode_checkpoint(encode_expert(UID, expert, optimizer)).tensors
    if kind == "nan":
        tensors["exp_avg.up.weight"][0, 0] = float("nan")
    if kind == "extra":
        tensors["param.extra"] = torch.zeros(1)
    if kind == "dtype":
        tensors["param.up.bias"] = tensors["param.up.bias"].double()
    return encode_checkpoint(tensors, {"expert": UID, "round": 2})


@pytest.mark.parametrize("kind, field", [("garbage", "data"), ("uid", "expert"), ("shape", "tensors."),
                                         ("nan", "tensors.exp_avg.up.weight"), ("extra", "tensors"),
                                         ("dtype", "tensors.param.up.bias")])
def test_what_is_not_the_runs_expert_is_refused_naming_the_field(kind, field):
    with pytest.raises(ExpertStateError) as refused:
        restore_expert(bad(kind), UID, FeedForward(8, 16))
    assert str(refused.value).startswith(field), refused.value


def test_the_coordinator_keeps_the_last_checkpoint_of_each_expert_and_only_the_runs(tmp_path):
    keeper = ExpertCheckpoints(tmp_path / "experts", [UID, "moe0.0.0"], lambda: FeedForward(8, 16))
    assert keeper.load(UID) is None
    first, second = encode_expert(UID, *trained(1)), encode_expert(UID, *trained(3))
    assert keeper.save(UID, first) == 1 and keeper.save(UID, second) == 3
    assert keeper.load(UID) == second and keeper.load("moe0.0.0") is None
    assert len(second) <= keeper.max_bytes
    with pytest.raises(ExpertStateError):
        keeper.save(UID, bad("nan"))
    assert keeper.load(UID) == second  # a refused upload leaves the last one
    with pytest.raises(KeyError):
        keeper.load("../../etc/passwd")
