"""Python operators and array-style methods, shared by eager Tensors and traced Symbols."""

import numpy as np

from . import elementwise as ew, linalg, reduce, shape
from ..errors import ArgumentError, IndexRangeError, ShapeError


class OperatorMixin:
    """Gives a class with ``.shape`` and ``.dtype`` NumPy-like operators built on the ops."""

    __slots__ = ()
    __array_priority__ = 100  # ndarray <op> Tensor defers to Tensor's reflected operator

    def __add__(self, other): return ew.add(self, other)
    def __radd__(self, other): return ew.add(other, self)
    def __sub__(self, other): return ew.sub(self, other)
    def __rsub__(self, other): return ew.sub(other, self)
    def __mul__(self, other): return ew.mul(self, other)
    def __rmul__(self, other): return ew.mul(other, self)
    def __truediv__(self, other): return ew.div(self, other)
    def __rtruediv__(self, other): return ew.div(other, self)
    def __neg__(self): return ew.neg(self)
    def __pow__(self, exponent): return ew.pow(self, exponent)
    def __matmul__(self, other): return linalg.matmul(self, other)
    def __rmatmul__(self, other): return linalg.matmul(other, self)
    def __gt__(self, other): return ew.greater(self, other)
    def __ge__(self, other): return ew.greater_equal(self, other)
    def __lt__(self, other): return ew.less(self, other)
    def __le__(self, other): return ew.less_equal(self, other)

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
            raise ArgumentError("len() of a 0-d tensor: it has no first axis")
        return self.shape[0]

    def sum(self, axis=None, keepdims=False): return reduce.sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return reduce.mean(self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return reduce.max(self, axis, keepdims)
    def reshape(self, *shape_):
        return shape.reshape(self, shape_[0] if len(shape_) == 1 else shape_)
    def transpose(self, *axes): return shape.transpose(self, axes[0] if len(axes) == 1 else (axes or None))
    def astype(self, dtype): return ew.astype(self, dtype)

    def __getitem__(self, key):
        """Basic indexing: integers and step-1 slices (a view-like slice, then a reshape)."""
        key = key if isinstance(key, tuple) else (key,)
        if len(key) > self.ndim or not all(isinstance(k, (int, np.integer, slice)) for k in key):
            raise ShapeError(f"indexing with {key!r}: only integers and slices, at most one per "
                             f"axis of shape {tuple(self.shape)}, are supported; use take_rows "
                             f"for gathers")
        out, out_shape = self, []
        for axis, k in enumerate(key):
            size = self.shape[axis]
            if isinstance(k, slice):
                start, stop, step = k.indices(size)
                if step != 1:
                    raise ShapeError(f"indexing: slice step {step} is not supported")
                stop = builtins_max(start, stop)
                out = shape.slice_axis(out, start, stop, axis)
                out_shape.append(stop - start)
            else:
                if not -size <= k < size:  # IndexError ends Python's iteration protocol
                    raise IndexRangeError(f"index {k} is out of range for axis {axis} of size {size}")
                k = int(k) % size
                out = shape.slice_axis(out, k, k + 1, axis)
        out_shape += list(self.shape[len(key):])
        return shape.reshape(out, tuple(out_shape))


builtins_max = max
