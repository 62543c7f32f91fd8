"""Fast-Slow recurrent language model over bytes.

Mujika, Meier and Steger, "Fast-Slow Recurrent Neural Networks", NeurIPS 2017.

A Fast-Slow RNN has a lower "fast" layer of k cells F1..Fk and a higher "slow" layer of one cell S. At each time
step t the fast cells all run once, one after another, and S runs once between F1 and F2:

    F1 reads the input x_t, with the state that Fk left at step t-1 as its recurrent state;
    S  reads F1's output h^{F1}_t, with its own state from step t-1;
    F2 reads S's output h^S_t, with F1's (h, c) as its recurrent state;
    F3..Fk read no input, only the previous fast cell's (h, c) as their recurrent state;
    the output at step t is h^{Fk}_t, and an affine map of it is the prediction.

Every cell is an LSTM with layer normalisation (Ba, Kiros and Hinton 2016) and zoneout on both c and h
(Krueger et al., "Zoneout: Regularizing RNNs by Randomly Preserving Hidden Activations", 2016), as in the paper.
"""

from __future__ import annotations

import torch
from torch import nn

from cotrain.models.rnn_lm import VOCAB_SIZE, ByteLanguageModel


def _zoneout(prev: torch.Tensor, new: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Each unit keeps its previous value with probability p (sampled in training, the expectation in eval)."""
    if p == 0.0:
        return new
    if training:
        keep = torch.rand_like(new) < p
        return torch.where(keep, prev, new)
    return p * prev + (1.0 - p) * new


class LayerNormLSTMCell(nn.Module):
    """An LSTM cell with layer normalisation and zoneout.

    The input part W_x x and the recurrent part W_h h of the gate pre-activations are layer-normalised separately
    and then summed (the recurrent norm's shift acts as the gate bias); the cell state is layer-normalised before
    the output tanh:

        i, f, o, g = LN(W_x x) + LN(W_h h)
        c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
        h' = sigmoid(o) * tanh(LN(c'))

    then zoneout mixes c' with c and h' with h. With ``input_size == 0`` the cell has no input weights at all and
    ``forward`` takes ``x=None``.
    """

    def __init__(self, input_size: int, hidden_size: int, zoneout_cell: float = 0.0, zoneout_hidden: float = 0.0):
        super().__init__()
        if input_size < 0 or hidden_size <= 0:
            raise ValueError(f"input_size must be >= 0 and hidden_size > 0, got {input_size}, {hidden_size}")
        for name, p in (("zoneout_cell", zoneout_cell), ("zoneout_hidden", zoneout_hidden)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p}")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.zoneout_cell, self.zoneout_hidden = zoneout_cell, zoneout_hidden
        if input_size > 0:
            self.weight_x = nn.Linear(input_size, 4 * hidden_size, bias=False)
            self.norm_x = nn.LayerNorm(4 * hidden_size, bias=False)
        else:
            self.weight_x = self.norm_x = None
        self.weight_h = nn.Linear(hidden_size, 4 * hidden_size, bias=False)
        self.norm_h = nn.LayerNorm(4 * hidden_size)
        self.norm_c = nn.LayerNorm(hidden_size)
        with torch.no_grad():  # forget gate bias 1: remember by default at the start of training
            self.norm_h.bias[hidden_size:2 * hidden_size].fill_(1.0)

    def input_gates(self, x: torch.Tensor) -> torch.Tensor:
        """LN(W_x x) for inputs of any leading shape (..., input_size): a sequence's at once, before the time loop
        (one large product instead of one a step)."""
        return self.norm_x(self.weight_x(x))

    def forward(self, x: torch.Tensor | None, state: tuple[torch.Tensor, torch.Tensor],
                x_gates: torch.Tensor | None = None):
        """x: (batch, input_size), or None when input_size is 0; state: (h, c), each (batch, hidden_size);
        ``x_gates``: :meth:`input_gates` of x, computed before (x is then not read)."""
        h, c = state
        gates = self.norm_h(self.weight_h(h))
        if x_gates is not None:
            gates = gates + x_gates
        elif self.weight_x is not None:
            if x is None:
                raise ValueError("this cell has an input (input_size > 0) but x is None")
            gates = gates + self.input_gates(x)
        elif x is not None:
            raise ValueError("this cell has no input (input_size == 0); pass x=None")
        i, f, o, g = gates.chunk(4, dim=-1)
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.sigmoid(o) * torch.tanh(self.norm_c(c_new))
        return (_zoneout(h, h_new, self.zoneout_hidden, self.training),
                _zoneout(c, c_new, self.zoneout_cell, self.training))


class FastSlowRNN(nn.Module):
    """k fast cells F1..Fk and one slow cell S, wired as in the paper (see the module docstring).

    State: ``((h_fast, c_fast), (h_slow, c_slow))``, each (batch, size): Fk's state and S's state after the last step.
    """

    def __init__(self, input_size: int, fast_size: int, slow_size: int, fast_cells: int = 2,
                 zoneout_cell: float = 0.0, zoneout_hidden: float = 0.0):
        super().__init__()
        if fast_cells < 2:
            raise ValueError(f"fast_cells must be >= 2 (F1 below the slow cell, F2 above it), got {fast_cells}")
        self.input_size, self.fast_size, self.slow_size = input_size, fast_size, slow_size
        zoneout = dict(zoneout_cell=zoneout_cell, zoneout_hidden=zoneout_hidden)
        fast_inputs = [input_size, slow_size] + [0] * (fast_cells - 2)  # F1 <- x_t, F2 <- h^S, F3.. <- nothing
        self.fast = nn.ModuleList([LayerNormLSTMCell(n, fast_size, **zoneout) for n in fast_inputs])
        self.slow = LayerNormLSTMCell(fast_size, slow_size, **zoneout)

    def init_state(self, batch: int, device=None):
        dtype = self.slow.weight_h.weight.dtype

        def zeros(size):
            return torch.zeros(batch, size, device=device, dtype=dtype)
        return (zeros(self.fast_size), zeros(self.fast_size)), (zeros(self.slow_size), zeros(self.slow_size))

    def forward(self, x: torch.Tensor, state=None):
        """x: (batch, time, input_size) -> outputs (batch, time, fast_size), new state."""
        if state is None:
            state = self.init_state(x.shape[0], x.device)
        fast_state, slow_state = state
        outputs = []
        # F1's input part for every step at once (it reads no state); unbind, not x_gates[:, t]: the backward of
        # each slice would write a whole sequence's zeros, and the backward of unbind stacks the steps' once
        x_gates = self.fast[0].input_gates(x).unbind(1)
        for t in range(x.shape[1]):
            fast_state = self.fast[0](None, fast_state, x_gates[t])   # F1: x_t, Fk's state from t-1
            slow_state = self.slow(fast_state[0], slow_state)          # S: h^{F1}_t, own state from t-1
            fast_state = self.fast[1](slow_state[0], fast_state)       # F2: h^S_t, F1's (h, c)
            for cell in self.fast[2:]:
                fast_state = cell(None, fast_state)                    # F3..Fk: previous fast cell's (h, c)
            outputs.append(fast_state[0])                              # h^{Fk}_t
        return torch.stack(outputs, dim=1), (fast_state, slow_state)


class FastSlowLM(ByteLanguageModel):
    """Byte embedding -> FastSlowRNN -> dropout -> linear head over the byte values ("an affine map of Fk's output
    is the prediction"). A drop-in for ``RNNLanguageModel``."""

    def __init__(self, embed_dim: int = 64, fast_size: int = 256, slow_size: int = 256, fast_cells: int = 2,
                 zoneout_cell: float = 0.0, zoneout_hidden: float = 0.0, dropout: float = 0.0,
                 vocab_size: int = VOCAB_SIZE):
        core = FastSlowRNN(embed_dim, fast_size, slow_size, fast_cells, zoneout_cell, zoneout_hidden)
        super().__init__(embed_dim, core, fast_size, dropout, vocab_size)
