"""The state a group's members hold identically (cotrain.averaging.shared_state): what a joiner may take in, and the
checkpoint it downloads."""

import pytest
import torch

from cotrain.averaging.diloco import DiLoCo
from cotrain.averaging.reduction import Reduction
from cotrain.averaging.shared_state import SharedState
from cotrain.checkpoint import decode_checkpoint, shared_tensors_of
from cotrain.config import AveragingConfig, CompressionConfig


def shared(run_id="run") -> SharedState:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    cfg = AveragingConfig()
    strategy = DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg, grad_clip=1.0)
    reduction = Reduction(None, cfg, CompressionConfig(), [p.shape for p in model.parameters()], strategy.feedback)
    return SharedState(strategy, reduction, [n for n, _ in model.named_parameters()], run_id)


def test_the_downloaded_checkpoint_is_the_state_and_its_metadata():
    state = shared()
    ckpt = decode_checkpoint(state.encoded(lambda: {"round": 7}), origin="test")
    assert ckpt.metadata["round"] == 7 and ckpt.metadata["strategy"] == "diloco" and ckpt.metadata["run_id"] == "run"
    tensors = shared_tensors_of(ckpt, state.param_names)
    assert len(tensors) == 4 and all(torch.equal(a, b) for a, b in zip(tensors, state.tensors()))
    assert shared().check(ckpt.metadata, tensors) is False  # a whole state: not parameters only


@pytest.mark.parametrize("metadata, count, shape, field", [
    ({"run_id": "other", "strategy": "diloco"}, 4, None, "run"),
    ({"run_id": "run", "strategy": "sync"}, 4, None, "strategy"),
    ({"run_id": "run", "strategy": "diloco"}, 3, None, "tensors"),
    ({"run_id": "run", "strategy": "diloco"}, 4, (5, 5), "shape"),
])
def test_a_state_that_does_not_fit_is_refused_naming_what(metadata, count, shape, field):
    state = shared()
    tensors = [t.clone() for t in state.tensors()][:count]
    if shape is not None:
        tensors[0] = torch.zeros(shape)
    with pytest.raises(ValueError, match=field):
        state.check(metadata, tensors)


def test_a_coordinators_parameters_alone_restart_the_strategys_own_state():
    state = shared()
    for t in state.tensors():
        t.fill_(3.0)
    params = [torch.ones(2, 3), torch.ones(2)]
    assert state.check({"run_id": "run"}, params) is True
    with torch.no_grad(), state.lock:
        state.write(params, params_only=True)
    global_params, momentum = state.tensors()[:2], state.tensors()[2:]
    assert all(torch.equal(t, torch.ones_like(t)) for t in global_params)
    assert all(torch.equal(t, torch.zeros_like(t)) for t in momentum)
    state.changed()
    assert state.hash() == shared_hash_of(state)


def shared_hash_of(state: SharedState) -> str:
    from cotrain.averaging.state import state_hash
    return state_hash(state.strategy.shared_tensors())
