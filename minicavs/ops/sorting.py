"""Sorting: the primitive ``argsort`` (stable, ascending or descending; NaN sorts as the
largest value, as in NumPy and PyTorch), and composed from it ``sort``, ``topk`` and
``take_along_axis``; ``unique``, which reads the values (its size depends on them).

Values are picked with :func:`take_along_axis`, one ``take_rows`` of the flattened array, so
their gradient scatter-adds back to where each value came from; indices are int64 and have no
gradient (as in PyTorch). Because the indices are an op's output, ``sort`` and ``topk`` also
work on traced symbols (a static function); inside a vertex cell ``take_rows`` needs a shared
table, so they do not.
"""

from collections import namedtuple

import numpy as np

from .. import backend
from . import index, shape
from .registry import Aval, Op, apply, describe, normalize_axis, register
from ..errors import GraphError, ShapeError, UnsupportedError

SortResult = namedtuple("SortResult", "values indices")
SortResult.__doc__ = "What sort, topk, cummax and cummin return (PyTorch's return types)."


def _argsort_forward(xp, x, axis, descending):
    kind = {"kind": "stable"} if xp is np else {}  # (CuPy's sort is stable: a radix sort)
    if not descending:
        return xp.argsort(x, axis=axis, **kind).astype(np.int64, copy=False)
    # descending and stable: sort the reversed axis ascending, and read the result backwards,
    # so equal values keep their order and NaN (last ascending) comes first
    order = xp.argsort(xp.flip(x, axis), axis=axis, **kind)
    return (x.shape[axis] - 1 - xp.flip(order, axis)).astype(np.int64, copy=False)


ARGSORT = register(Op("argsort", _argsort_forward,
                      lambda x, axis, descending: Aval(tuple(x.shape), np.dtype(np.int64)),
                      batch=lambda op, items, attrs, out: apply(
                          op, items[0][0], **dict(attrs, axis=attrs["axis"] + 1))))


def argsort(x, axis=-1, descending=False, stable=True):
    """The int64 indices that sort ``x`` along ``axis``. Always stable (equal values keep
    their order, descending too: ``stable=False`` promises less, so it gets the same); NaN
    sorts as the largest value. Not differentiable: an index has no gradient."""
    if len(x.shape) == 0:
        x = shape.reshape(x, (1,))
        return shape.reshape(argsort(x, 0, descending), ())
    axis = normalize_axis("argsort", int(axis), len(x.shape))
    return apply(ARGSORT, x, axis=axis, descending=bool(descending))


def take_along_axis(x, indices, axis):
    """``x``'s elements at ``indices`` along ``axis`` (``numpy.take_along_axis`` where
    ``indices`` has ``x``'s shape on the other axes): unlike :func:`mc.gather`, the indices
    may be a traced value (argsort's). They must lie in ``[0, x.shape[axis])``."""
    axis = normalize_axis("take_along_axis", int(axis), len(x.shape))
    if len(indices.shape) != len(x.shape) or any(
            a != b for d, (a, b) in enumerate(zip(indices.shape, x.shape)) if d != axis):
        raise ShapeError(f"take_along_axis: indices of shape {describe(indices.shape)} must "
                         f"have the shape of x {describe(x.shape)} on every axis but {axis}")
    strides = np.cumprod((tuple(x.shape[1:]) + (1,))[::-1])[::-1].astype(np.int64)
    coords = np.indices(tuple(indices.shape), dtype=np.int64, sparse=True)
    offset = sum(c * s for d, (c, s) in enumerate(zip(coords, strides)) if d != axis)
    flat = indices * int(strides[axis]) + offset if len(x.shape) > 1 else indices
    picked = index.take_rows(shape.reshape(x, (-1,)), shape.reshape(flat, (-1,)))
    return shape.reshape(picked, tuple(indices.shape))


def sort(x, axis=-1, descending=False, stable=True):
    """``(values, indices)`` of ``x`` sorted along ``axis`` (PyTorch's ``sort``; NumPy's
    ``sort`` is the values, ``argsort`` the indices). Stable; the gradient goes to each value's
    place."""
    if len(x.shape) == 0:
        return SortResult(x, shape.reshape(argsort(x), ()))
    idx = argsort(x, axis, descending)
    return SortResult(take_along_axis(x, idx, axis), idx)


def topk(x, k, axis=-1, largest=True, sorted=True):  # noqa: A002 (PyTorch's name)
    """``(values, indices)`` of the ``k`` largest (``largest=False``: smallest) elements
    along ``axis``, largest first; of equal values the first ones."""
    axis = normalize_axis("topk", int(axis), max(len(x.shape), 1))
    size = x.shape[axis] if len(x.shape) else 1
    if not isinstance(k, (int, np.integer)) or not 0 <= k <= size:
        raise ShapeError(f"topk: k={k!r} must be an int in 0..{size} (the size of axis {axis} "
                         f"of x with shape {describe(x.shape)})")
    if len(x.shape) == 0:
        return sort(x)
    idx = shape.slice_axis(argsort(x, axis, descending=largest), 0, int(k), axis)
    return SortResult(take_along_axis(x, idx, axis), idx)


# --- unique -----------------------------------------------------------------------------------

def _refuse_gradient(g, out, x, result):
    raise UnsupportedError("backward(): op 'unique' is not differentiable (as in PyTorch); "
                           "detach its result, or use sort, whose values have a gradient")


# Not registered: it holds its (value-dependent) result as an attribute, and exists to make a
# gradient through unique a clear error, as PyTorch's is.
_UNIQUE = Op("unique", lambda xp, x, result: result,
             lambda x, result: Aval(tuple(result.shape), np.dtype(result.dtype)),
             vjp=_refuse_gradient)


def unique(x, sorted=True, return_inverse=False, return_counts=False, axis=None):  # noqa: A002
    """The distinct values of ``x`` (flattened; ``axis``: the distinct slices along it), in
    ascending order (``sorted=False`` gives the same), as ``torch.unique``: with
    ``return_inverse``, also where each element of ``x`` went (shape of ``x``, or of the axis),
    with ``return_counts``, how often each value occurs; all int64. NaNs are each distinct, as
    in PyTorch. The result's size depends on the values, so ``x`` must be data, not a traced
    value; it is not differentiable."""
    if getattr(type(x), "__minicavs_priority__", 0) >= 2:
        raise GraphError("unique: its result's size depends on the values, so it cannot be "
                         "traced; call it on data")
    from ..autodiff.tensor import Tensor

    tensor = x if isinstance(x, Tensor) else Tensor(np.asarray(x))
    data = tensor._array
    xp = backend.get_array_module(data)
    if axis is not None:
        axis = normalize_axis("unique", int(axis), data.ndim)
    values, inverse, counts = xp.unique(data, return_inverse=True, return_counts=True,
                                        axis=axis, equal_nan=False)
    inverse = inverse.reshape(data.shape if axis is None else (-1,)).astype(np.int64)
    out = Tensor(values)
    if tensor.requires_grad:
        out = apply(_UNIQUE, tensor, result=values)
    extra = [Tensor(inverse)] if return_inverse else []
    extra += [Tensor(counts.astype(np.int64))] if return_counts else []
    return (out, *extra) if extra else out
