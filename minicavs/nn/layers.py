"""Layers beyond Linear and Embedding: ``Sequential``, ``Dropout``, ``LayerNorm`` and the
activations as modules. Each is composed from ops, so it also works on symbols: inside a
vertex cell or a static function (Dropout only in eval mode there, see :func:`dropout`)."""

import numpy as np

from .. import backend, ops
from ..autodiff import Parameter
from ..errors import GraphError, IndexRangeError, ShapeError, UnsupportedError
from .module import Module


class Sequential(Module):
    """Modules applied one after another; ``Sequential(a, b)(x)`` is ``b(a(x))``. The
    submodules are attributes named "0", "1", ... (so parameters are "0.weight", as in
    PyTorch); index, iterate and ``len()`` as a list."""

    def __init__(self, *modules):
        self._count = 0
        for module in modules:
            self.append(module)

    def append(self, module):
        if not isinstance(module, Module):
            raise UnsupportedError(f"Sequential: item {self._count} is a "
                                   f"{type(module).__name__}, not a Module")
        setattr(self, str(self._count), module)
        self._count += 1
        return self

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(*[self[k] for k in range(self._count)[i]])
        if not -self._count <= i < self._count:
            raise IndexRangeError(f"Sequential: index {i} out of range for {self._count} modules")
        return getattr(self, str(i % self._count))

    def __len__(self):
        return self._count

    def __iter__(self):
        return (self[i] for i in range(self._count))

    def forward(self, x):
        for module in self:
            x = module(x)
        return x


def dropout(x, p=0.5, training=True):
    """Each element zeroed with probability ``p`` and the others scaled by ``1 / (1 - p)``
    (so the expectation is unchanged); the identity when not ``training``. The mask is drawn
    from minicavs' generator (``mc.seed``). Inside a traced function one mask would be frozen
    into the graph, so that is refused: apply dropout to F's inputs or outputs instead."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if getattr(type(x), "__minicavs_priority__", 0) >= 2:
        raise GraphError("dropout in training mode inside a traced function (a vertex cell or "
                         "mc.symbolic) would freeze one random mask into the graph; apply it to "
                         "the function's inputs or outputs, or call eval() on the module")
    if p == 1.0:
        return x * 0.0
    keep = backend.rng().random(tuple(x.shape)) >= p
    if getattr(x, "device", "cpu") == "cuda":
        keep = backend.to_device(keep, "cuda")
    return ops.where(keep, x * (1.0 / (1.0 - p)), 0.0)


class Dropout(Module):
    def __init__(self, p=0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = float(p)

    def forward(self, x):
        return dropout(x, self.p, self.training)

    def __repr__(self):
        return f"Dropout(p={self.p})"


class LayerNorm(Module):
    """Normalise over the last axes (``normalized_shape``) to mean 0 and variance 1 (biased,
    plus ``eps``), then scale by ``weight`` and shift by ``bias`` (ones and zeros at first)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, dtype=None):
        shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else \
            tuple(normalized_shape)
        self.normalized_shape, self.eps = tuple(int(d) for d in shape), float(eps)
        dtype = np.dtype(dtype) if dtype is not None else backend.default_dtype()
        ones, zeros = np.ones(self.normalized_shape, dtype), np.zeros(self.normalized_shape, dtype)
        self.weight = Parameter(ones) if elementwise_affine else None
        self.bias = Parameter(zeros) if elementwise_affine else None

    def forward(self, x):
        k = len(self.normalized_shape)
        if tuple(x.shape[len(x.shape) - k:]) != self.normalized_shape:
            raise ShapeError(f"LayerNorm: input of shape {tuple(x.shape)} does not end in the "
                             f"normalized shape {self.normalized_shape}")
        axes = tuple(range(-k, 0))
        centred = x - ops.mean(x, axis=axes, keepdims=True)
        variance = ops.mean(centred * centred, axis=axes, keepdims=True)
        y = centred * ops.rsqrt(variance + self.eps)
        if self.weight is not None:
            y = y * self.weight + self.bias
        return y


def _activation(name, fn, doc):
    """A module class that applies ``fn`` (keyword arguments of the constructor passed on)."""
    def __init__(self, *args, **options):
        self.args, self.options = args, options

    def forward(self, x):
        return fn(x, *self.args, **self.options)

    def __repr__(self):
        args = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.options.items()]
        return f"{name}({', '.join(args)})"

    return type(name, (Module,), {"__init__": __init__, "forward": forward,
                                  "__repr__": __repr__, "__doc__": doc})


Identity = _activation("Identity", lambda x: x, "Returns its input.")
ReLU = _activation("ReLU", ops.relu, "max(x, 0).")
Tanh = _activation("Tanh", ops.tanh, "tanh(x).")
Sigmoid = _activation("Sigmoid", ops.sigmoid, "1 / (1 + exp(-x)).")
GELU = _activation("GELU", ops.gelu, "x Φ(x); GELU(approximate='tanh') for the tanh form.")
SiLU = _activation("SiLU", ops.silu, "x sigmoid(x).")
ELU = _activation("ELU", ops.elu, "x, or alpha (exp(x) - 1) for x <= 0; ELU(alpha=...).")
LeakyReLU = _activation("LeakyReLU", ops.leaky_relu,
                        "x, or negative_slope * x for x <= 0; LeakyReLU(negative_slope=...).")
Softplus = _activation("Softplus", ops.softplus, "log(1 + exp(x)); Softplus(beta=...).")
Softmax = _activation("Softmax", ops.softmax, "softmax along axis (Softmax(axis=-1)).")
LogSoftmax = _activation("LogSoftmax", ops.log_softmax, "log_softmax along axis.")

__all__ = ["Sequential", "Dropout", "dropout", "LayerNorm", "Identity", "ReLU", "Tanh",
           "Sigmoid", "GELU", "SiLU", "ELU", "LeakyReLU", "Softplus", "Softmax", "LogSoftmax"]
