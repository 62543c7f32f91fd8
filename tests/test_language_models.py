"""The byte-level LSTM and GRU language models: shapes, carried state, and the output bias started from the text."""

import math

import pytest
import torch
from torch.nn import functional as F

from cotrain.models import RNNLanguageModel, build_model
from tiny_swarm import tiny_config


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_shapes_and_carried_state(kind):
    torch.manual_seed(0)
    model = RNNLanguageModel(kind, embed_dim=8, hidden_size=16, num_layers=2, dropout=0.0).eval()
    tokens = torch.randint(0, 256, (3, 10))
    logits, state = model(tokens)
    assert logits.shape == (3, 10, 256)
    first, carried = model(tokens[:, :6])[1], None
    _, carried = model(tokens[:, 6:], first)
    whole = model(tokens)[1]
    for a, b in zip(carried if kind == "lstm" else (carried,), whole if kind == "lstm" else (whole,)):
        assert torch.allclose(a, b, atol=1e-6)  # two halves with the state carried = one pass


def test_output_bias_starts_at_the_texts_byte_frequencies(corpus_file):
    cfg = tiny_config(corpus_file)
    text = open(corpus_file, "rb").read(20_000)
    counts = [text.count(bytes([b])) for b in range(256)]
    tokens = torch.tensor(list(text[:4097])).view(1, -1)

    def initial_loss(byte_counts):
        model = build_model(cfg, byte_counts).eval()
        logits, _ = model(tokens[:, :-1])
        return F.cross_entropy(logits[0], tokens[0, 1:]).item(), model

    zero_bias, _ = initial_loss(None)
    prior, model = initial_loss(counts)
    probs = torch.tensor(counts, dtype=torch.float64) / sum(counts)
    entropy = -(probs[probs > 0] * probs[probs > 0].log()).sum().item()
    assert zero_bias > math.log(256) - 0.2  # uniform over all 256 byte values
    assert prior < entropy + 0.3  # about the unigram entropy of the text from the first step
    assert model.head.bias.argmax().item() == max(range(256), key=counts.__getitem__)


def test_byte_counts_of_the_wrong_length_are_refused(corpus_file):
    with pytest.raises(ValueError, match="byte_counts"):
        build_model(tiny_config(corpus_file), [1] * 65)
