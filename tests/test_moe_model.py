"""The mixture-of-experts language model in one process: every part learns, the routing takes only the experts that
are up, a step with too few answers is refused, and it is built from the run config."""

import pytest
import torch
from torch.nn import functional as F

from cotrain.config import RunConfig
from cotrain.models import build_model
from cotrain.models.moe_lm import MixtureLM
from cotrain.moe.hosted import hosted_layers, layer_hosts
from cotrain.moe.mixture import LocalExperts, MixtureLayer, TooFewExperts

SMALL = dict(embed_dim=16, hidden_size=32, grid=(2, 3), expert_hidden=32, k=2, chunk=8)


def loss_of(model, tokens):
    logits, _ = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def test_the_mixture_learns_and_every_part_gets_a_gradient():
    torch.manual_seed(0)
    model = MixtureLM(**SMALL)
    tokens = torch.randint(0, 256, (4, 21))  # 20 steps: chunks of 8, 8 and 4
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = float(loss_of(model, tokens).detach())
    for _ in range(30):
        opt.zero_grad()
        loss_of(model, tokens).backward()
        opt.step()
    assert float(loss_of(model, tokens).detach()) < 0.5 * first
    layer = model.rnn.layers[0]
    assert layer.gate.weight.grad.abs().sum() > 0
    used = [e for e in layer.experts.experts if e.up.weight.grad is not None and e.up.weight.grad.abs().sum() > 0]
    assert len(used) >= 2


class Flaky(LocalExperts):
    """Local experts of which some are down (not offered) and some do not answer."""

    def __init__(self, *args, down=(), silent=()):
        super().__init__(*args)
        self.down, self.silent, self.called = set(down), set(silent), set()

    def available(self):
        return [e for e in super().available() if e not in self.down]

    def __call__(self, requests):
        self.called |= set(requests)
        return {e: (None if e in self.silent else out) for e, out in super().__call__(requests).items()}


def test_experts_that_are_down_are_never_called():
    experts = Flaky(6, 32, 32, down=(0, 1, 2, 3))
    layer = MixtureLayer(32, (2, 3), 2, 1, 8, experts)
    layer(torch.randn(3, 16, 32))
    assert experts.called <= {4, 5}


def test_a_silent_expert_is_left_out_and_too_few_answers_refuse_the_step():
    h = torch.randn(3, 16, 32)
    some = MixtureLayer(32, (2, 3), 2, 1, 8, Flaky(6, 32, 32, down=(0, 1, 2, 3), silent=(5,)))
    assert torch.isfinite(some(h)).all()  # each chunk had expert 4 answer
    strict = MixtureLayer(32, (2, 3), 2, 2, 8, Flaky(6, 32, 32, down=(0, 1, 2, 3), silent=(5,)))
    with pytest.raises(TooFewExperts, match="k_min = 2"):
        strict(h)


def moe_config(experts: str) -> RunConfig:
    return RunConfig.model_validate({"model": {"kind": "moe_lstm", "embed_dim": 16, "hidden_size": 32},
                                     "moe": {"grid": [2, 2], "expert_hidden": 16, "k": 2, "chunk": 4, "layers": 2,
                                             "experts": experts}})


def test_the_run_config_builds_it():
    model = build_model(moe_config("local"))
    assert isinstance(model, MixtureLM) and len(model.rnn.layers) == 2
    assert len(model.rnn.layers[0].experts.experts) == 4
    logits, state = model(torch.randint(0, 256, (2, 9)))
    assert logits.shape == (2, 9, 256) and state is not None


def test_a_hosted_mixtures_trainer_holds_no_expert_and_steps_only_once_attached():
    local, hosted = build_model(moe_config("local")), build_model(moe_config("hosted"))
    names = {n for n, _ in hosted.named_parameters()}
    assert names == {n for n, _ in local.named_parameters() if ".experts." not in n}  # the shared state: no expert
    assert [layer.layer for layer in hosted_layers(hosted)] == [0, 1] and hosted_layers(local) == []
    with pytest.raises(TooFewExperts, match="0 expert"):  # not attached yet: the trainer skips the step
        hosted(torch.randint(0, 256, (2, 9)))
    for layer, own in zip(hosted_layers(hosted), local.rnn.layers):
        layer.attach(own.experts)  # any Experts: here the local model's
    logits, _ = hosted(torch.randint(0, 256, (2, 9)))
    assert logits.shape == (2, 9, 256)


@pytest.mark.parametrize("directory, layer, expected", [
    ({}, 0, {}),
    ({"moe0.0.0": "P1", "moe0.1.1": "P2", "moe1.0.0": "P3"}, 0, {0: ("moe0.0.0", "P1"), 3: ("moe0.1.1", "P2")}),
    ({"moe0.0.0": "P1", "moe1.0.1": "P3"}, 1, {1: ("moe1.0.1", "P3")}),
    ({"moe0.2.0": "P1", "moe0.0.1": "", "other": "P4"}, 0, {}),  # off the grid, no peer, not an expert
])
def test_a_layers_hosts_come_from_the_directory(directory, layer, expected):
    assert layer_hosts(directory, layer, (2, 2)) == expected
