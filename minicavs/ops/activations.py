"""Activations. ``softmax`` and ``log_softmax`` are primitives: their VJPs,
``p * (g - Σ g p)`` and ``g - p Σ g``, are exact formulas, where the composite's gradient
reaches the same value through the shift by the maximum and a division, losing bits on the way
(float32 softmax at (45, 65): 9e-8 from the float64 truth composed, 3e-8 as a primitive); they
are also two passes fewer. The others are composed from elementwise primitives, so fusion sees
through them, with the gradient PyTorch gives at each kink.
"""

import numpy as np

from . import batching, elementwise as ew, reduce
from .registry import Aval, Op, register, require_float


def _softmax_forward(xp, x, axis):
    shifted = x - xp.max(x, axis=axis, keepdims=True)
    xp.exp(shifted, out=shifted)
    shifted /= xp.sum(shifted, axis=axis, keepdims=True)
    return shifted


def _log_softmax_forward(xp, x, axis):
    shifted = x - xp.max(x, axis=axis, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=axis, keepdims=True))


def _infer_along(name):
    def infer(x, axis):
        require_float(name, x)
        return Aval(tuple(x.shape), np.dtype(x.dtype))
    return infer


SOFTMAX = register(Op(
    "softmax", _softmax_forward, _infer_along("softmax"),
    lambda g, out, x, axis: (out * (g - reduce.sum(g * out, axis, keepdims=True)),),
    batch=batching.along_axis_rule, promotes=(0,), promotes_to_float=True))
LOG_SOFTMAX = register(Op(
    "log_softmax", _log_softmax_forward, _infer_along("log_softmax"),
    lambda g, out, x, axis: (g - ew.exp(out) * reduce.sum(g, axis, keepdims=True),),
    batch=batching.along_axis_rule, promotes=(0,), promotes_to_float=True))


def softmax(x, axis=-1):
    """``exp(x) / sum(exp(x))`` along ``axis``, computed shifted by the maximum."""
    return reduce.along_axis(SOFTMAX, x, axis)


def log_softmax(x, axis=-1):
    """``x - logsumexp(x)`` along ``axis``."""
    return reduce.along_axis(LOG_SOFTMAX, x, axis)


def leaky_relu(x, negative_slope=0.01):
    """``x`` where positive, ``negative_slope * x`` elsewhere (gradient at 0: the slope)."""
    return ew.where(ew.greater(x, 0), x, x * negative_slope)


def elu(x, alpha=1.0):
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere. The exponential reads only the
    non-positive side, so a large x cannot overflow into a NaN gradient."""
    positive = ew.greater(x, 0)
    return ew.where(positive, x, alpha * ew.expm1(ew.where(positive, 0, x)))


def silu(x):
    """``x * sigmoid(x)`` (swish)."""
    return x * ew.sigmoid(x)


def gelu(x, approximate="none"):
    """``x * Φ(x)``, Φ the standard normal CDF (``0.5 * (1 + erf(x / √2))``), as PyTorch's
    default; ``approximate="tanh"``: ``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))``."""
    if approximate == "tanh":
        inner = (x + 0.044715 * x * x * x) * float(np.sqrt(2 / np.pi))
        return 0.5 * x * (1 + ew.tanh(inner))
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * x * (1 + ew.erf(x * float(1 / np.sqrt(2))))


def softplus(x, beta=1.0):
    """``log(1 + exp(beta x)) / beta``, written ``max(z, 0) + log1p(exp(-|z|))`` so neither
    side overflows, each side with its own ``where`` so the gradient at 0 is sigmoid(0)."""
    z = x * beta if beta != 1 else x
    positive = ew.greater(z, 0)
    value = ew.where(positive, z, 0) + ew.log1p(ew.exp(ew.where(positive, ew.neg(z), z)))
    return value / beta if beta != 1 else value


def hardtanh(x, low=-1.0, high=1.0):
    return clip(x, low, high)


def clip(x, low=None, high=None):
    """``x`` limited to [low, high] (either may be None). The gradient is 1 inside the range,
    bounds included, and 0 outside (as PyTorch's clamp)."""
    if low is not None:
        x = ew.where(ew.less(x, low), low, x)
    if high is not None:
        x = ew.where(ew.greater(x, high), high, x)
    return x
