"""Recurrent layers: ``LSTMCell`` and ``GRUCell`` (one step), ``LSTM`` and ``GRU`` (a whole
sequence, layer by layer).

A cell is composed from ops, so it works on eager Tensors and on symbols alike: inside a
vertex function, ``h, c = lstm(v.pull(), (h_prev, c_prev))`` is an LSTM step per vertex, and
the cell's Parameters are captured by F (and found by ``Module.parameters()`` through the
module that holds the cell). ``LSTM`` and ``GRU`` loop over time steps eagerly; for sequences
of different lengths, run the cell in a VertexFunction over chains (``InputGraph.chain``),
which batches every step of every sequence without padding.

Weights are stored (in, out), as everywhere in minicavs; the LSTM's gates are stacked
[i, f, o, u] (``mc.lstm_gates``), the GRU's [r, z, n] as in PyTorch. All start from
U(-1/√H, 1/√H), PyTorch's initialisation.
"""

import numpy as np

from .. import backend, ops
from ..autodiff import Parameter
from ..errors import ShapeError
from .layers import dropout
from .module import Module


def _uniform(shape, hidden, dtype):
    bound = 1.0 / np.sqrt(hidden)
    dtype = np.dtype(dtype) if dtype is not None else backend.default_dtype()
    return Parameter(backend.rng().uniform(-bound, bound, shape).astype(dtype))


class LSTMCell(Module):
    """``(h, c) = cell(x, (h_prev, c_prev))``; without a state, it starts from zeros."""

    def __init__(self, input_size, hidden_size, bias=True, dtype=None):
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        H = self.hidden_size
        self.weight_ih = _uniform((self.input_size, 4 * H), H, dtype)
        self.weight_hh = _uniform((H, 4 * H), H, dtype)
        self.bias = _uniform((4 * H,), H, dtype) if bias else None

    def project(self, x):
        """The input's part of the gates, ``x @ weight_ih + bias`` (for all steps at once)."""
        return ops.linear(x, self.weight_ih, self.bias)

    def forward(self, x, state=None, projected=None):
        """``projected``: :meth:`project` of ``x``, when the caller computed it already."""
        gates = projected if projected is not None else self.project(x)
        if state is None:  # h = c = 0: no recurrent term
            return ops.lstm_gates(gates, 0.0)
        h, c = state
        return ops.lstm_gates(gates + ops.matmul(h, self.weight_hh), c)


class GRUCell(Module):
    """``h = cell(x, h_prev)``: r = σ(x W_r + h U_r + b), z likewise,
    n = tanh(x W_n + b_n + r ⊙ (h U_n + b_hn)), h = (1 - z) ⊙ n + z ⊙ h_prev."""

    def __init__(self, input_size, hidden_size, bias=True, dtype=None):
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        H = self.hidden_size
        self.weight_ih = _uniform((self.input_size, 3 * H), H, dtype)
        self.weight_hh = _uniform((H, 3 * H), H, dtype)
        self.bias_ih = _uniform((3 * H,), H, dtype) if bias else None
        self.bias_hh = _uniform((3 * H,), H, dtype) if bias else None

    def project(self, x):
        return ops.linear(x, self.weight_ih, self.bias_ih)

    def forward(self, x, state=None, projected=None):
        gates_x = projected if projected is not None else self.project(x)
        r_x, z_x, n_x = ops.split(gates_x, 3)
        if state is None:  # h = 0: the recurrent term is the bias alone
            r_h, z_h, n_h = (0.0,) * 3 if self.bias_hh is None else ops.split(self.bias_hh, 3)
        else:
            r_h, z_h, n_h = ops.split(ops.linear(state, self.weight_hh, self.bias_hh), 3)
        r = ops.sigmoid(r_x + r_h)
        z = ops.sigmoid(z_x + z_h)
        n = ops.tanh(n_x + r * n_h)
        return (1 - z) * n if state is None else (1 - z) * n + z * state


class _Recurrent(Module):
    """Layers of one cell type over a sequence (T, N, input) (``batch_first``: (N, T, ...))."""

    cell_type = None

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, dtype=None):
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.num_layers, self.batch_first, self.dropout = int(num_layers), batch_first, dropout
        self.layers = [self.cell_type(self.input_size if i == 0 else self.hidden_size,
                                      self.hidden_size, bias, dtype)
                       for i in range(self.num_layers)]

    def _sequence(self, x):
        if len(x.shape) != 3 or x.shape[-1] != self.input_size or 0 in x.shape[:2]:
            layout = "(N, T, input)" if self.batch_first else "(T, N, input)"
            raise ShapeError(f"{type(self).__name__}: input of shape {tuple(x.shape)}; expected "
                             f"{layout} with input = {self.input_size} and T, N > 0")
        return ops.transpose(x, (1, 0, 2)) if self.batch_first else x

    def _run(self, x, initial, step):
        """Each layer over every time step; ``step(cell, projected_t, state) -> (output,
        state)``. Returns the last layer's outputs and each layer's final state."""
        x = self._sequence(x)
        finals = []
        for i, cell in enumerate(self.layers):
            if i and self.dropout:
                x = dropout(x, self.dropout, self.training)
            projected = cell.project(x)  # one GEMM for every time step
            state = None if initial is None else initial(i)
            outputs = []
            for t in range(x.shape[0]):
                out, state = step(cell, projected[t], state)
                outputs.append(out)
            finals.append(state)
            x = ops.stack(outputs)
        return (ops.transpose(x, (1, 0, 2)) if self.batch_first else x), finals


class LSTM(_Recurrent):
    """``output, (h_n, c_n) = lstm(x, (h_0, c_0))``: output (T, N, H) from the last layer;
    h_n, c_n (num_layers, N, H); without a state, zeros."""

    cell_type = LSTMCell

    def forward(self, x, state=None):
        initial = None if state is None else (lambda i: (state[0][i], state[1][i]))

        def step(cell, projected, s):
            h, c = cell(None, s, projected=projected)
            return h, (h, c)

        output, finals = self._run(x, initial, step)
        return output, (ops.stack([h for h, _ in finals]), ops.stack([c for _, c in finals]))


class GRU(_Recurrent):
    """``output, h_n = gru(x, h_0)``: output (T, N, H) from the last layer; h_n
    (num_layers, N, H); without a state, zeros."""

    cell_type = GRUCell

    def forward(self, x, state=None):
        initial = None if state is None else (lambda i: state[i])

        def step(cell, projected, s):
            h = cell(None, s, projected=projected)
            return h, h

        output, finals = self._run(x, initial, step)
        return output, ops.stack(finals)
