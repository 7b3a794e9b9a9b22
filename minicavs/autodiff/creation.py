"""Tensors made from a shape: ``zeros``, ``ones``, ``full``, ``arange``, ``eye``, ``rand``,
``randn`` and the ``*_like`` forms, on the current device (``mc.set_device``) unless
``device=`` says otherwise.

Float results take the default dtype (``mc.default_dtype()``, float32) unless ``dtype=`` is
given; ``full`` and ``arange`` take the kind of their numbers (an int fill or int range is
int64, a bool fill is bool), as in NumPy and PyTorch. Random draws come from minicavs' own
generator (:func:`minicavs.backend.rng`), so ``mc.seed(n)`` makes them reproducible, the same
on the CPU and a GPU.
"""

import numpy as np

from .. import backend
from ..errors import ShapeError
from .tensor import Tensor, as_array


def _shape(args):
    """``zeros(2, 3)`` and ``zeros((2, 3))`` alike."""
    shape = args[0] if len(args) == 1 and not isinstance(args[0], (int, np.integer)) else args
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ShapeError(f"negative dimension in shape {shape}")
    return shape


def _make(array, device, requires_grad):
    return Tensor(as_array(array, device=device), requires_grad=requires_grad)


def _float(dtype):
    return np.dtype(dtype) if dtype is not None else backend.default_dtype()


def zeros(*shape, dtype=None, device=None, requires_grad=False):
    return _make(np.zeros(_shape(shape), _float(dtype)), device, requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad=False):
    return _make(np.ones(_shape(shape), _float(dtype)), device, requires_grad)


def _fill_dtype(value, dtype):
    if dtype is not None:
        return np.dtype(dtype)
    if isinstance(value, (bool, np.bool_)):
        return np.dtype(np.bool_)
    if isinstance(value, (int, np.integer)):
        return np.dtype(np.int64)
    return backend.default_dtype()


def full(shape, fill_value, dtype=None, device=None, requires_grad=False):
    values = np.full(_shape((shape,)), fill_value, _fill_dtype(fill_value, dtype))
    return _make(values, device, requires_grad)


def arange(start, stop=None, step=1, dtype=None, device=None, requires_grad=False):
    """``start, start + step, ...`` below ``stop`` (``arange(n)``: 0 .. n-1)."""
    if stop is None:
        start, stop = 0, start
    is_int = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
    dtype = np.dtype(dtype) if dtype is not None else (np.dtype(np.int64) if is_int else
                                                       backend.default_dtype())
    if step == 0:
        raise ShapeError("arange: step must not be 0")
    return _make(np.arange(start, stop, step).astype(dtype), device, requires_grad)


def eye(n, m=None, k=0, dtype=None, device=None, requires_grad=False):
    """An n x m matrix with ones on diagonal ``k``."""
    return _make(np.eye(n, m, k, dtype=_float(dtype)), device, requires_grad)


def rand(*shape, dtype=None, device=None, requires_grad=False):
    """Draws from U[0, 1)."""
    return _make(backend.rng().random(_shape(shape)).astype(_float(dtype)), device, requires_grad)


def randn(*shape, dtype=None, device=None, requires_grad=False):
    """Draws from the standard normal distribution."""
    values = backend.rng().standard_normal(_shape(shape)).astype(_float(dtype))
    return _make(values, device, requires_grad)


def _like(creator):
    def like(x, dtype=None, device=None, requires_grad=False):
        dtype = np.dtype(dtype) if dtype is not None else np.dtype(x.dtype)
        device = device or getattr(x, "device", None)
        return creator(tuple(x.shape), dtype=dtype, device=device, requires_grad=requires_grad)
    like.__name__ = f"{creator.__name__}_like"
    like.__doc__ = f"``{creator.__name__}`` of ``x``'s shape, dtype and device."
    return like


zeros_like = _like(zeros)
ones_like = _like(ones)
rand_like = _like(rand)
randn_like = _like(randn)


def full_like(x, fill_value, dtype=None, device=None, requires_grad=False):
    dtype = np.dtype(dtype) if dtype is not None else np.dtype(x.dtype)
    return full(tuple(x.shape), fill_value, dtype, device or getattr(x, "device", None),
                requires_grad)
