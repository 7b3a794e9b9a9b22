"""Reductions over axes: sum and max are primitives, mean is sum scaled."""

import numpy as np

from . import batching, elementwise, shape
from .registry import Aval, Op, apply, normalize_axes, register
from .rows import FULL, KEEPS
from ..errors import ShapeError


def _reduced_shape(x_shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(x_shape))
    return tuple(d for i, d in enumerate(x_shape) if i not in axes)


def _infer_reduce(name, allow_empty):
    def infer(x, axes, keepdims):
        if not allow_empty and any(x.shape[a] == 0 for a in axes):
            raise ShapeError(f"op '{name}': cannot reduce an empty axis of argument 0 with "
                             f"shape {tuple(x.shape)} over axes {axes}")
        return Aval(_reduced_shape(tuple(x.shape), axes, keepdims), np.dtype(x.dtype))
    return infer


def _sum_vjp(g, out, x, axes, keepdims):
    g = shape.reshape(g, _reduced_shape(tuple(x.shape), axes, True))
    return (shape.broadcast_to(g, tuple(x.shape)),)


def _max_vjp(g, out, x, axes, keepdims):
    # The gradient goes to the maxima; ties share it equally.
    kept = _reduced_shape(tuple(x.shape), axes, True)
    is_max = elementwise.equal(x, shape.reshape(out, kept))
    count = sum(elementwise.astype(is_max, x.dtype), axis=axes, keepdims=True)
    return (elementwise.where(is_max, shape.reshape(g, kept) / count, 0),)


def _batch_reduce(op, items, attrs, out):
    (x, _), = items
    return apply(op, x, **dict(attrs, axes=batching.shift(attrs["axes"])))


def _zero_rows_reduce(ranges, axes, keepdims):
    return FULL if 0 in axes else KEEPS(ranges)  # reducing over the rows mixes them


SUM = register(Op("sum", lambda xp, x, axes, keepdims: xp.sum(x, axis=axes, keepdims=keepdims),
                  _infer_reduce("sum", True), _sum_vjp, batch=_batch_reduce,
                  zero_rows=_zero_rows_reduce))
MAX = register(Op("max", lambda xp, x, axes, keepdims: xp.max(x, axis=axes, keepdims=keepdims),
                  _infer_reduce("max", False), _max_vjp, batch=_batch_reduce,
                  zero_rows=_zero_rows_reduce))


def sum(x, axis=None, keepdims=False):  # noqa: A001 (mirrors numpy.sum)
    """Sum over ``axis`` (None: all axes; an int or a tuple)."""
    return apply(SUM, x, axes=normalize_axes("sum", axis, len(x.shape)), keepdims=bool(keepdims))


def max(x, axis=None, keepdims=False):  # noqa: A001 (mirrors numpy.max)
    return apply(MAX, x, axes=normalize_axes("max", axis, len(x.shape)), keepdims=bool(keepdims))


def mean(x, axis=None, keepdims=False):
    axes = normalize_axes("mean", axis, len(x.shape))
    count = int(np.prod([x.shape[a] for a in axes]))
    return sum(x, axes, keepdims) * (1.0 / count if count else float("nan"))
