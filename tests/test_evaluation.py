"""One evaluation path: the run's initial model, loading a state into it, and evaluating it the same way whoever
asks (the coordinator on checkpoint bytes, the demo and the benches on a state)."""

import pytest
import torch

from cotrain.models import RNNLanguageModel, build_model, initial_seed
from cotrain.models.world import build_world_model
from cotrain.warmstart import fresh_parameters
from tiny_swarm import tiny_config


def parameters(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_build_model_draws_the_runs_initial_weights_from_its_seed_alone(corpus_file):
    cfg = tiny_config(corpus_file)
    first = parameters(build_model(cfg))
    torch.manual_seed(123)
    torch.rand(1000)
    before = torch.random.get_rng_state()
    second = parameters(build_model(cfg))
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's random state is left alone
    assert same(first, second)
    # the weights of seeding the global generator, then constructing the model (what every caller did before)
    m = cfg.model
    torch.manual_seed(cfg.run.seed)
    reference = RNNLanguageModel(m.kind, m.embed_dim, m.hidden_size, m.num_layers, m.dropout)
    assert same(first, parameters(reference))
    assert not same(first, parameters(build_model(cfg.with_overrides(run={"seed": cfg.run.seed + 1}))))


def test_build_model_of_a_world_model_is_seeded_the_same_way(corpus_file):
    cfg = tiny_config(corpus_file, model={"kind": "mdn_rnn", "hidden_size": 16, "num_mixtures": 3},
                      env={"id": "Pendulum-v1"})
    torch.manual_seed(cfg.run.seed)
    reference = build_world_model("mdn_rnn", 3, 1, 16, cfg.model.num_layers, 3)
    torch.manual_seed(7)
    assert same(parameters(build_model(cfg)), parameters(reference))


def test_initial_seed_draws_other_weights_from_the_same_initializer(corpus_file):
    cfg = tiny_config(corpus_file)
    with initial_seed(5):
        five = parameters(build_model(cfg))
    assert same(five, parameters(build_model(cfg.with_overrides(run={"seed": 5}))))
    assert not same(five, parameters(build_model(cfg)))  # the override ends with the block
    # shrink and perturb's noise: the run's model from another seed, not the run's initial weights
    assert same(fresh_parameters(lambda: build_model(cfg), seed=5), five)
