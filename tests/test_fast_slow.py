"""The Fast-Slow RNN language model: shapes, carried state, the paper's wiring, zoneout, and that it learns."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cotrain.models.fast_slow import FastSlowLM, FastSlowRNN, LayerNormLSTMCell



def random_state(batch, fast_size, slow_size):
    return ((torch.randn(batch, fast_size), torch.randn(batch, fast_size)),
            (torch.randn(batch, slow_size), torch.randn(batch, slow_size)))


# ---- shapes and state ---------------------------------------------------------------------------------------------

def test_lm_shapes_and_state_structure():
    torch.manual_seed(0)
    model = FastSlowLM(embed_dim=8, fast_size=12, slow_size=10, fast_cells=3)
    tokens = torch.randint(0, 256, (3, 5))
    logits, state = model(tokens)
    assert logits.shape == (3, 5, 256)
    (h_fast, c_fast), (h_slow, c_slow) = state
    assert h_fast.shape == c_fast.shape == (3, 12)
    assert h_slow.shape == c_slow.shape == (3, 10)


def test_rnn_shapes_and_init_state():
    torch.manual_seed(0)
    rnn = FastSlowRNN(input_size=7, fast_size=12, slow_size=10, fast_cells=4)
    out, ((hf, cf), (hs, cs)) = rnn(torch.randn(2, 6, 7))
    assert out.shape == (2, 6, 12)
    assert hf.shape == cf.shape == (2, 12) and hs.shape == cs.shape == (2, 10)
    (zf, zcf), (zs, zcs) = rnn.init_state(2, torch.device("cpu"))
    for z, size in ((zf, 12), (zcf, 12), (zs, 10), (zcs, 10)):
        assert z.shape == (2, size) and not z.any()
    # state=None means zeros
    x = torch.randn(2, 4, 7)
    assert torch.equal(rnn(x)[0], rnn(x, rnn.init_state(2, x.device))[0])


def test_state_carried_across_calls_matches_one_call():
    torch.manual_seed(0)
    model = FastSlowLM(embed_dim=8, fast_size=12, slow_size=10, fast_cells=3, zoneout_cell=0.2,
                       zoneout_hidden=0.1, dropout=0.3).eval()
    tokens = torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        full, full_state = model(tokens)
        first, state = model(tokens[:, :4])
        second, split_state = model(tokens[:, 4:], model.detach_state(state))
    torch.testing.assert_close(torch.cat([first, second], dim=1), full)
    for a, b in zip(full_state, split_state):
        torch.testing.assert_close(a, b)


def test_detach_state_keeps_structure():
    torch.manual_seed(0)
    model = FastSlowLM(embed_dim=8, fast_size=6, slow_size=5)
    _, state = model(torch.randint(0, 256, (2, 3)))
    assert state[0][0].requires_grad
    detached = model.detach_state(state)
    assert isinstance(detached, tuple) and len(detached) == 2
    for pair, orig in zip(detached, state):
        assert isinstance(pair, tuple) and len(pair) == 2
        for t, o in zip(pair, orig):
            assert not t.requires_grad and torch.equal(t, o)
    assert FastSlowLM.detach_state(None) is None


def test_fast_cells_below_two_raises():
    with pytest.raises(ValueError, match="fast_cells"):
        FastSlowRNN(4, 8, 8, fast_cells=1)
    with pytest.raises(ValueError, match="fast_cells"):
        FastSlowLM(embed_dim=4, fast_size=8, slow_size=8, fast_cells=1)


# ---- the paper's wiring -------------------------------------------------------------------------------------------

def record_calls(rnn: FastSlowRNN):
    """Replace each cell's forward with one that logs (name, x, state, output) in call order."""
    calls = []

    def wrap(name, cell):
        original = cell.forward

        def forward(x, state, x_gates=None):
            out = original(x, state, x_gates)
            calls.append((name, x if x_gates is None else ("gates", x_gates), state, out))
            return out
        cell.forward = forward

    for i, cell in enumerate(rnn.fast, start=1):
        wrap(f"F{i}", cell)
    wrap("S", rnn.slow)
    return calls


@pytest.mark.parametrize("k", [3, 4])
def test_wiring_matches_paper(k):
    torch.manual_seed(0)
    batch, time, input_size, fast_size, slow_size = 2, 3, 5, 7, 6
    rnn = FastSlowRNN(input_size, fast_size, slow_size, fast_cells=k)
    assert len(rnn.fast) == k
    assert rnn.fast[0].input_size == input_size and rnn.fast[1].input_size == slow_size
    assert rnn.slow.input_size == fast_size
    assert all(cell.input_size == 0 for cell in rnn.fast[2:])

    calls = record_calls(rnn)
    x = torch.randn(batch, time, input_size)
    state0 = random_state(batch, fast_size, slow_size)
    outputs, ((h_fast, c_fast), (h_slow, c_slow)) = rnn(x, state0)

    order = ["F1", "S", "F2"] + [f"F{i}" for i in range(3, k + 1)]
    assert [c[0] for c in calls] == order * time
    steps = [dict((name, (inp, st, out)) for name, inp, st, out in calls[t * len(order):(t + 1) * len(order)])
             for t in range(time)]

    prev_fast, prev_slow = state0
    for t, step in enumerate(steps):
        # F1 reads x_t (its input part computed for the whole sequence before the loop), with the fast state Fk
        # left at t-1 (the given state at t=0)
        inp, st, out_f1 = step["F1"]
        assert inp[0] == "gates"
        torch.testing.assert_close(inp[1], rnn.fast[0].input_gates(x[:, t]), rtol=0, atol=1e-6)
        assert st[0] is prev_fast[0] and st[1] is prev_fast[1]
        # S reads F1's h, with its own previous state
        inp, st, out_s = step["S"]
        assert inp is out_f1[0]
        assert st[0] is prev_slow[0] and st[1] is prev_slow[1]
        # F2 reads S's h, with F1's (h, c) as its recurrent state
        inp, st, out = step["F2"]
        assert inp is out_s[0]
        assert st[0] is out_f1[0] and st[1] is out_f1[1]
        # F3..Fk read no input, only the previous fast cell's (h, c)
        for i in range(3, k + 1):
            inp, st, new_out = step[f"F{i}"]
            assert inp is None
            assert st[0] is out[0] and st[1] is out[1]
            out = new_out
        # the output at t is Fk's h
        assert torch.equal(outputs[:, t], out[0])
        assert torch.equal(outputs[:, t], step[f"F{k}"][2][0])
        prev_fast, prev_slow = out, out_s

    # the returned state is Fk's and S's state after the last step
    assert h_fast is prev_fast[0] and c_fast is prev_fast[1]
    assert h_slow is prev_slow[0] and c_slow is prev_slow[1]


# ---- the cell -----------------------------------------------------------------------------------------------------

def test_cell_without_input_has_no_input_weights():
    torch.manual_seed(0)
    hidden = 6
    cell = LayerNormLSTMCell(0, hidden)
    assert cell.weight_x is None and cell.norm_x is None
    # recurrent weights (4H x H), the recurrent norm's gain and shift (4H each), the cell norm's gain and shift (H each)
    assert sum(p.numel() for p in cell.parameters()) == 4 * hidden * hidden + 2 * 4 * hidden + 2 * hidden
    assert all(p.shape[-1] != 0 for p in cell.parameters())
    state = (torch.randn(3, hidden), torch.randn(3, hidden))
    h, c = cell(None, state)
    assert h.shape == c.shape == (3, hidden)
    with pytest.raises(ValueError):
        cell(torch.randn(3, 1), state)
    with_input = LayerNormLSTMCell(4, hidden)
    assert with_input.weight_x.weight.shape == (4 * hidden, 4)


def test_cell_layer_norm_invariances():
    """The input and recurrent parts of the gate pre-activations are normalised separately: rescaling W_x or W_h
    (each by its own factor) changes nothing."""
    torch.manual_seed(0)
    cell = LayerNormLSTMCell(4, 5).eval()
    x, state = torch.randn(3, 4), (torch.randn(3, 5), torch.randn(3, 5))
    h, c = cell(x, state)
    with torch.no_grad():
        cell.weight_x.weight.mul_(3.0)
        cell.weight_h.weight.mul_(2.0)
    h2, c2 = cell(x, state)
    # equal up to the norms' epsilon
    torch.testing.assert_close(h, h2, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(c, c2, atol=1e-4, rtol=1e-4)


def test_zoneout_eval_is_deterministic_expectation():
    torch.manual_seed(0)
    plain = LayerNormLSTMCell(4, 6).eval()
    zoned = LayerNormLSTMCell(4, 6, zoneout_cell=0.3, zoneout_hidden=0.6).eval()
    zoned.load_state_dict(plain.state_dict())
    x, (h0, c0) = torch.randn(5, 4), (torch.randn(5, 6), torch.randn(5, 6))
    h, c = zoned(x, (h0, c0))
    h_again, c_again = zoned(x, (h0, c0))
    assert torch.equal(h, h_again) and torch.equal(c, c_again)
    h_new, c_new = plain(x, (h0, c0))
    torch.testing.assert_close(h, 0.6 * h0 + 0.4 * h_new)
    torch.testing.assert_close(c, 0.3 * c0 + 0.7 * c_new)


def test_zoneout_one_in_training_never_changes_state():
    torch.manual_seed(0)
    cell = LayerNormLSTMCell(4, 6, zoneout_cell=1.0, zoneout_hidden=1.0).train()
    h0, c0 = torch.randn(5, 6), torch.randn(5, 6)
    h, c = cell(torch.randn(5, 4), (h0, c0))
    assert torch.equal(h, h0) and torch.equal(c, c0)
    # and through the whole network: every cell keeps its state, so the output is the initial fast h throughout
    rnn = FastSlowRNN(4, 6, 5, fast_cells=3, zoneout_cell=1.0, zoneout_hidden=1.0).train()
    state0 = random_state(2, 6, 5)
    out, ((hf, cf), (hs, cs)) = rnn(torch.randn(2, 4, 4), state0)
    assert torch.equal(out, state0[0][0].unsqueeze(1).expand(2, 4, 6))
    assert torch.equal(hf, state0[0][0]) and torch.equal(cf, state0[0][1])
    assert torch.equal(hs, state0[1][0]) and torch.equal(cs, state0[1][1])


def test_zoneout_zero_train_and_eval_agree():
    torch.manual_seed(0)
    model = FastSlowLM(embed_dim=8, fast_size=10, slow_size=9, fast_cells=3)
    tokens = torch.randint(0, 256, (2, 6))
    train_logits, train_state = model.train()(tokens)
    eval_logits, eval_state = model.eval()(tokens)
    assert torch.equal(train_logits, eval_logits)
    assert torch.equal(train_state[0][0], eval_state[0][0]) and torch.equal(train_state[1][1], eval_state[1][1])


def test_zoneout_training_keeps_each_unit_or_updates_it():
    torch.manual_seed(0)
    plain = LayerNormLSTMCell(4, 32).train()
    zoned = LayerNormLSTMCell(4, 32, zoneout_cell=0.5, zoneout_hidden=0.5).train()
    zoned.load_state_dict(plain.state_dict())
    x, (h0, c0) = torch.randn(8, 4), (torch.randn(8, 32), torch.randn(8, 32))
    h_new, c_new = plain(x, (h0, c0))
    h, c = zoned(x, (h0, c0))
    for got, prev, new in ((h, h0, h_new), (c, c0, c_new)):
        kept, updated = got == prev, got == new
        assert (kept | updated).all()
        assert kept.any() and updated.any()


# ---- it learns ----------------------------------------------------------------------------------------------------

def test_loss_falls_on_repetitive_text():
    torch.manual_seed(0)
    data = torch.tensor(list(b"fast and slow. " * 40), dtype=torch.long)
    model = FastSlowLM(embed_dim=16, fast_size=24, slow_size=24, fast_cells=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    seq, batch = 20, 8

    def loss_on(starts):
        idx = starts[:, None] + torch.arange(seq + 1)
        chunk = data[idx]
        logits, _ = model(chunk[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))

    eval_starts = torch.randint(0, len(data) - seq - 1, (batch,))
    with torch.no_grad():
        initial = loss_on(eval_starts).item()
    for _ in range(80):
        loss = loss_on(torch.randint(0, len(data) - seq - 1, (batch,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        final = loss_on(eval_starts).item()
    assert final < 0.5 * initial, (initial, final)
