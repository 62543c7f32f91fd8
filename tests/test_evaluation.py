"""One evaluation path: the run's initial model, loading a state into it, and evaluating it the same way whoever
asks (the coordinator on checkpoint bytes, the demo and the benches on a state)."""

import math
import re

import pytest
import torch

import cotrain.evaluation
from cotrain.checkpoint import encode_checkpoint, named_state
from cotrain.coordinator.evaluator import Evaluator, evaluate_checkpoint
from cotrain.data import Corpus
from cotrain.evaluation import evaluate_model, evaluate_state, model_from_state, read_corpus
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


@pytest.fixture(scope="module")
def trained_state(corpus_file) -> dict[str, torch.Tensor]:
    """The tiny run's model a little away from its initial weights (a checkpoint's state, as the swarm makes it)."""
    cfg = tiny_config(corpus_file)
    generator = torch.Generator().manual_seed(0)
    return {name: p.detach() + 0.05 * torch.randn(p.shape, generator=generator)
            for name, p in build_model(cfg).named_parameters()}


def checkpoint_bytes(cfg, state) -> bytes:
    names = list(state)
    return encode_checkpoint(named_state(names, [state[n] for n in names]), dict(round=3, config_toml=cfg.to_toml()))


def test_the_coordinator_the_demo_and_the_benches_get_the_same_numbers(corpus_file, trained_state, monkeypatch):
    cfg = tiny_config(corpus_file)
    data = checkpoint_bytes(cfg, trained_state)
    corpus = read_corpus(cfg)
    coordinator = evaluate_checkpoint(cfg.to_toml(), data, max_bytes=cfg.coordinator.eval_bytes)
    kept_corpus = evaluate_checkpoint(cfg.to_toml(), data, max_bytes=cfg.coordinator.eval_bytes, corpus=corpus)
    bench = evaluate_state(cfg, trained_state, max_bytes=cfg.coordinator.eval_bytes)
    model = build_model(cfg)
    model.load_state_dict(trained_state)
    in_memory = evaluate_model(cfg, model, corpus=corpus, max_bytes=cfg.coordinator.eval_bytes)
    assert coordinator.keys() == {"val_loss", "val_bpc"}
    assert coordinator == kept_corpus == bench == in_memory
    assert evaluate_state(cfg, trained_state)["val_loss"] != bench["val_loss"]  # max_bytes reaches the task
    # the evaluator on the coordinator's thread: the same numbers again, with the corpus read once
    reads = []
    monkeypatch.setattr(cotrain.evaluation.Corpus, "from_source",
                        lambda *args, _read=Corpus.from_source: reads.append(args) or _read(*args))
    evaluator = Evaluator(cfg.to_toml(), cfg.coordinator.eval_bytes, every_rounds=1)
    assert evaluator.submit(3, lambda: data) == [(3, coordinator)]
    assert evaluator.submit(4, lambda: data) == [(4, coordinator)]
    assert len(reads) == 1


def test_the_initial_model_is_the_one_every_node_starts_from(corpus_file):
    cfg = tiny_config(corpus_file)
    corpus = read_corpus(cfg)
    model = build_model(cfg, corpus.byte_counts())  # as a node builds it from what the coordinator sends
    assert evaluate_state(cfg, None) == evaluate_model(cfg, model, corpus=corpus)
    assert same(parameters(model_from_state(cfg, None, corpus=corpus)), parameters(model))


def test_a_state_that_does_not_fit_names_the_parameter(corpus_file, trained_state):
    cfg = tiny_config(corpus_file)
    name = next(iter(trained_state))
    wrong = dict(trained_state, **{name: torch.zeros(3, 3)})
    with pytest.raises(ValueError, match=re.escape(name)):
        evaluate_state(cfg, wrong)
    with pytest.raises(ValueError, match=re.escape(name)):
        evaluate_checkpoint(cfg.to_toml(), checkpoint_bytes(cfg, wrong))
    missing = {k: v for k, v in trained_state.items() if k != name}
    with pytest.raises(ValueError, match=re.escape(name)):
        evaluate_state(cfg, missing)
    bigger = tiny_config(corpus_file, model={"hidden_size": 96})
    with pytest.raises(ValueError, match="parameter"):
        evaluate_state(bigger, trained_state)


def same_metrics(a: dict, b: dict) -> bool:
    """Equal metrics, NaN equal to NaN (world models' val_bpc; open-loop errors past the horizon)."""
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def test_a_world_model_is_evaluated_the_same_way_with_its_controller(corpus_file):
    cfg = tiny_config(corpus_file, model={"kind": "mdn_rnn", "hidden_size": 16, "num_mixtures": 3},
                      env={"id": "Pendulum-v1", "horizon": 12, "eval_episodes": 4})
    state = parameters(build_model(cfg))
    data = checkpoint_bytes(cfg, state)
    plain = evaluate_checkpoint(cfg.to_toml(), data)
    assert same_metrics(plain, evaluate_state(cfg, state))
    assert {"nll", "mse", "normalized_mse", "reward_mae"} <= plain.keys() and plain["val_loss"] == plain["nll"]
    assert math.isnan(plain["val_bpc"])
    with_controller = evaluate_checkpoint(cfg.to_toml(), data, controller=True)
    assert same_metrics(with_controller, evaluate_state(cfg, state, controller=True))
    assert with_controller.keys() - plain.keys() == {"controller_return", "random_return"}
    assert same_metrics({k: with_controller[k] for k in plain}, plain)
