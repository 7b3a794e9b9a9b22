"""Composite functions, written with primitives only: their gradients come for free, and
fusion sees through them."""

from . import elementwise as ew, shape


def lstm_gates(preactivation, c_prev):
    """One LSTM update from the stacked gate pre-activations [i, f, o, u] (last axis, 4H).

    Returns ``(h, c)``: c = σ(i)⊙tanh(u) + σ(f)⊙c_prev, h = σ(o)⊙tanh(c).
    """
    i, f, o, u = shape.split(preactivation, 4, axis=-1)
    c = ew.sigmoid(i) * ew.tanh(u) + ew.sigmoid(f) * c_prev
    h = ew.sigmoid(o) * ew.tanh(c)
    return h, c
