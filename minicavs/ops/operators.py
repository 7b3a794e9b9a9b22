"""Python operators and array-style methods, shared by eager Tensors and traced Symbols.

Every operator is elementwise and broadcasts, as in NumPy and PyTorch: ``a == b`` and
``a != b`` are boolean tensors (never a Python bool; a Tensor still hashes by identity), ``&``,
``|``, ``^`` and ``~`` are logical operations on boolean tensors and bitwise ones on integers,
``<<`` and ``>>`` shift integers, ``//`` and ``%`` are floor division and Python's remainder
(the sign of the divisor), and ``x ** y`` takes a number or a tensor as the exponent
(``2 ** x`` too). Operands are promoted to one dtype by the op
registry (registry.py, "Type promotion").
"""

import numpy as np

from . import (activations, arithmetic, bitwise, elementwise as ew, indexing, linalg, reduce,
               scan, scattering, shape, sorting)
from .. import backend
from ..errors import UnsupportedError
from .registry import apply


def _operand(other):
    """``other`` as an operand of an operator, or None if it is not one (the operator then
    returns NotImplemented, and Python tries the other side or falls back to identity)."""
    if getattr(type(other), "__minicavs_priority__", None) is not None:
        return other
    if isinstance(other, (bool, int, float, np.number, np.bool_)):
        return other
    if backend.is_array(other):  # (a CuPy array too: else CuPy's reflected operator would
        return other            # take the Tensor as an array and drop its gradient)
    if isinstance(other, (list, tuple)):
        return np.asarray(other)
    return None


def _binary(fn, reflected=False):
    def operator(self, other):
        other = _operand(other)
        if other is None:
            return NotImplemented
        return fn(other, self) if reflected else fn(self, other)
    return operator


def _primitive(op, reflected=False):
    """An operator that is one primitive applied as it is (``a + b`` is ``add``): applied
    directly, a call fewer on the path of the commonest ops (autobatch records each one)."""
    def operator(self, other):
        other = _operand(other)
        if other is None:
            return NotImplemented
        return apply(op, other, self) if reflected else apply(op, self, other)
    return operator


def _bitwise(logical, bits, symbol):
    """``&``, ``|``, ``^``: logical on two bools, bitwise on integers (a bool with an integer
    is promoted to the integer type, as in NumPy and PyTorch); floats are refused."""
    def operator(self, other):
        other = _operand(other)
        if other is None:
            return NotImplemented
        dtypes = [np.dtype(getattr(x, "dtype", type(x))) for x in (self, other)]
        kinds = [d.kind for d in dtypes]
        for dtype in dtypes:
            if dtype.kind not in "biu":
                raise UnsupportedError(f"operator {symbol}: minicavs defines it on boolean "
                                       f"tensors (a logical operation) and integer tensors "
                                       f"(bitwise), got dtype {dtype}; for floats compare "
                                       f"first, e.g. (x > 0) {symbol} (y > 0)")
        return logical(self, other) if kinds == ["b", "b"] else bits(self, other)
    return operator


class OperatorMixin:
    """Gives a class with ``.shape`` and ``.dtype`` NumPy-like operators built on the ops."""

    __slots__ = ()
    __array_priority__ = 1000  # ndarray <op> Tensor, NumPy's or CuPy's, defers to the Tensor

    __add__, __radd__ = _primitive(ew.ADD), _primitive(ew.ADD, reflected=True)
    __sub__, __rsub__ = _primitive(ew.SUB), _primitive(ew.SUB, reflected=True)
    __mul__, __rmul__ = _primitive(ew.MUL), _primitive(ew.MUL, reflected=True)
    __truediv__, __rtruediv__ = _primitive(ew.DIV), _primitive(ew.DIV, reflected=True)
    __pow__, __rpow__ = _binary(ew.pow), _binary(ew.pow, reflected=True)
    __matmul__ = _primitive(linalg.MATMUL)
    __rmatmul__ = _primitive(linalg.MATMUL, reflected=True)
    __gt__, __ge__ = _binary(ew.greater), _binary(ew.greater_equal)
    __lt__, __le__ = _binary(ew.less), _binary(ew.less_equal)
    __eq__, __ne__ = _binary(ew.equal), _binary(ew.not_equal)
    __hash__ = object.__hash__  # by identity, as PyTorch's tensors (== is elementwise)
    __mod__, __rmod__ = _binary(arithmetic.remainder), _binary(arithmetic.remainder, True)
    __floordiv__ = _binary(arithmetic.floor_divide)
    __rfloordiv__ = _binary(arithmetic.floor_divide, reflected=True)
    __lshift__, __rlshift__ = _binary(bitwise.left_shift), _binary(bitwise.left_shift, True)
    __rshift__, __rrshift__ = _binary(bitwise.right_shift), _binary(bitwise.right_shift, True)
    __and__ = __rand__ = _bitwise(ew.logical_and, bitwise.bitwise_and, "&")
    __or__ = __ror__ = _bitwise(ew.logical_or, bitwise.bitwise_or, "|")
    __xor__ = __rxor__ = _bitwise(ew.logical_xor, bitwise.bitwise_xor, "^")

    def __neg__(self): return ew.neg(self)
    def __pos__(self): return self
    def __abs__(self): return ew.abs(self)

    def __invert__(self):
        if np.dtype(self.dtype).kind not in "biu":
            raise UnsupportedError(f"operator ~: minicavs defines it on boolean tensors "
                                   f"(logical not) and integer tensors (bitwise not), got "
                                   f"dtype {np.dtype(self.dtype)}")
        return bitwise.bitwise_not(self)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape))

    @property
    def T(self):
        return shape.transpose(self)

    def __len__(self):
        if not self.shape:
            raise UnsupportedError("len() of a 0-d tensor")
        return self.shape[0]

    # reductions
    def sum(self, axis=None, keepdims=False): return reduce.sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return reduce.mean(self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return reduce.max(self, axis, keepdims)
    def min(self, axis=None, keepdims=False): return reduce.min(self, axis, keepdims)
    def prod(self, axis=None, keepdims=False): return reduce.prod(self, axis, keepdims)
    def var(self, axis=None, keepdims=False, ddof=0): return reduce.var(self, axis, keepdims, ddof)
    def std(self, axis=None, keepdims=False, ddof=0): return reduce.std(self, axis, keepdims, ddof)
    def argmax(self, axis=None, keepdims=False): return reduce.argmax(self, axis, keepdims)
    def argmin(self, axis=None, keepdims=False): return reduce.argmin(self, axis, keepdims)
    def cumsum(self, axis=-1): return reduce.cumsum(self, axis)
    def any(self, axis=None, keepdims=False): return reduce.any(self, axis, keepdims)
    def all(self, axis=None, keepdims=False): return reduce.all(self, axis, keepdims)
    def logsumexp(self, axis=None, keepdims=False): return reduce.logsumexp(self, axis, keepdims)

    # elementwise
    def abs(self): return ew.abs(self)
    def exp(self): return ew.exp(self)
    def log(self): return ew.log(self)
    def sqrt(self): return ew.sqrt(self)
    def tanh(self): return ew.tanh(self)
    def sigmoid(self): return ew.sigmoid(self)
    def relu(self): return ew.relu(self)
    def clip(self, low=None, high=None): return activations.clip(self, low, high)
    def astype(self, dtype): return ew.astype(self, dtype)
    def masked_fill(self, mask, value): return indexing.masked_fill(self, mask, value)
    def softmax(self, axis=-1): return activations.softmax(self, axis)
    def trunc(self): return arithmetic.trunc(self)
    def fmod(self, other): return arithmetic.fmod(self, other)
    def remainder(self, other): return arithmetic.remainder(self, other)
    def copysign(self, other): return arithmetic.copysign(self, other)

    def isclose(self, other, rtol=1e-5, atol=1e-8, equal_nan=False):
        return arithmetic.isclose(self, other, rtol, atol, equal_nan)

    def allclose(self, other, rtol=1e-5, atol=1e-8, equal_nan=False):
        return arithmetic.allclose(self, other, rtol, atol, equal_nan)

    # sorting, running products and extrema, scatters
    def sort(self, axis=-1, descending=False, stable=True):
        return sorting.sort(self, axis, descending, stable)

    def argsort(self, axis=-1, descending=False, stable=True):
        return sorting.argsort(self, axis, descending, stable)

    def topk(self, k, axis=-1, largest=True, sorted=True):  # noqa: A002 (PyTorch's name)
        return sorting.topk(self, k, axis, largest, sorted)

    def unique(self, sorted=True, return_inverse=False, return_counts=False,  # noqa: A002
               axis=None):
        return sorting.unique(self, sorted, return_inverse, return_counts, axis)

    def cumprod(self, axis=-1): return scan.cumprod(self, axis)
    def cummax(self, axis=-1): return scan.cummax(self, axis)
    def cummin(self, axis=-1): return scan.cummin(self, axis)
    def roll(self, shift, axis=None): return indexing.roll(self, shift, axis)
    def scatter(self, axis, index, src=None, value=None, reduce=None):
        return scattering.scatter(self, axis, index, src, value, reduce)

    def scatter_add(self, axis, index, src): return scattering.scatter_add(self, axis, index, src)

    def scatter_reduce(self, axis, index, src, reduce, include_self=True):
        return scattering.scatter_reduce(self, axis, index, src, reduce, include_self)

    # shapes
    def reshape(self, *shape_):
        return shape.reshape(self, shape_[0] if len(shape_) == 1 else shape_)

    def transpose(self, *axes):
        return shape.transpose(self, axes[0] if len(axes) == 1 else (axes or None))

    def flatten(self, start_axis=0, end_axis=-1): return shape.flatten(self, start_axis, end_axis)
    def squeeze(self, axis=None): return shape.squeeze(self, axis)
    def expand_dims(self, axis): return shape.expand_dims(self, axis)
    def flip(self, axis=None): return indexing.flip(self, axis)

    def __getitem__(self, key):
        """NumPy's indexing: integers, slices of any step, None, ..., integer arrays and
        boolean masks (see ops/indexing.py); the gradient scatter-adds."""
        return indexing.getitem(self, key)

    def __setitem__(self, key, value):
        raise UnsupportedError(f"{type(self).__name__}s are immutable (their values may be read "
                               f"by a recorded gradient); build a new one instead, e.g. "
                               f"mc.where(mask, value, x) or x.masked_fill(mask, value)")

    def __iter__(self):
        if not self.shape:
            raise UnsupportedError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))
