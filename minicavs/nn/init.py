"""Parameter initialisers.

Each returns a NumPy array drawn from :func:`minicavs.backend.rng`, so ``mc.seed(n)`` makes a
model's initial weights reproducible, and the same seed gives the same weights on the CPU and on
a GPU. Wrap the result in a :class:`~minicavs.Parameter`, which moves it to the current device.
Weights are stored (in, out), as ``x @ W`` uses them: fan-in is every axis but the last.
"""

import numpy as np

from .. import backend
from ..errors import ShapeError


def _dtype(dtype):
    return backend.default_dtype() if dtype is None else np.dtype(dtype)


def _fans(name, shape):
    if len(shape) < 2:
        raise ShapeError(f"init.{name}: needs a weight with at least 2 dimensions (in, out), "
                         f"got shape {tuple(shape)}")
    return int(np.prod(shape[:-1])), int(shape[-1])


def zeros(shape, dtype=None):
    return np.zeros(shape, _dtype(dtype))


def uniform(shape, low=-0.1, high=0.1, dtype=None):
    """Independent draws from U(low, high)."""
    return backend.rng().uniform(low, high, shape).astype(_dtype(dtype))


def normal(shape, std=1.0, dtype=None):
    return (backend.rng().standard_normal(shape) * std).astype(_dtype(dtype))


def xavier_uniform(shape, gain=1.0, dtype=None):
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot and Bengio, 2010): keeps
    the variance of activations and of gradients about constant from layer to layer."""
    fan_in, fan_out = _fans("xavier_uniform", shape)
    bound = gain * np.sqrt(6.0 / max(fan_in + fan_out, 1))
    return uniform(shape, -bound, bound, dtype)


def orthogonal(shape, gain=1.0, dtype=None):
    """A (scaled) matrix with orthonormal rows or columns, the weights reshaped to
    (fan_in, fan_out): a recurrent matrix that neither grows nor shrinks its state."""
    rows, cols = _fans("orthogonal", shape)
    q, r = np.linalg.qr(backend.rng().standard_normal((max(rows, cols), min(rows, cols))))
    q = q * np.sign(np.diag(r))  # QR's sign convention would bias the draw; this removes it
    if rows < cols:
        q = q.T
    return (gain * q).reshape(shape).astype(_dtype(dtype))
