"""Sorting: the primitive ``argsort`` (stable, ascending or descending; NaN sorts as the
largest value, as in NumPy and PyTorch), and composed from it ``sort``, ``topk`` and
``take_along_axis``; ``unique``, which reads the values (its size depends on them).

Values are picked with the primitive ``take_along_axis``, whose gradient is its adjoint
``put_along_axis_add`` (a scatter-add along the axis, indices repeating); indices are int64
and have no gradient (as in PyTorch). Both have batching rules, so ``sort`` and ``topk`` work
on eager tensors, in traced functions, inside vertex cells and under ``mc.autobatch``.
"""

from collections import namedtuple

import numpy as np

from .. import backend
from . import batching, index, reduce, shape
from .registry import Aval, Op, apply, describe, normalize_axis, register, require_int
from ..errors import GraphError, IndexRangeError, ShapeError, UnsupportedError

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
                      batch=batching.along_axis_rule))


def argsort(x, axis=-1, descending=False, stable=True):
    """The int64 indices that sort ``x`` along ``axis``. Always stable (equal values keep
    their order, descending too: ``stable=False`` promises less, so it gets the same); NaN
    sorts as the largest value. Not differentiable: an index has no gradient."""
    return reduce.along_axis(ARGSORT, x, axis, descending=bool(descending))


def _check_along(xp, idx, size, axis, opname):
    found = index.out_of_range(idx, 0, size - 1) if xp is np else None
    if found is not None:
        raise IndexRangeError(f"op '{opname}': index {found[0]} at position {found[1]} is out "
                              f"of range for axis {axis} with size {size}")


def _take_along_forward(xp, x, idx, axis):
    _check_along(xp, idx, x.shape[axis], axis, "take_along_axis")
    return xp.take_along_axis(x, idx, axis=axis)


def _put_along_add_forward(xp, g, idx, axis, size):
    _check_along(xp, idx, size, axis, "put_along_axis_add")
    out = xp.zeros(shape.resized(g.shape, axis, size), dtype=g.dtype)
    coords = list(np.ogrid[tuple(slice(n) for n in g.shape)]) if g.ndim else []
    coords[axis] = idx
    if xp is np:
        np.add.at(out, tuple(coords), g)  # repeated indices add up
        return out
    from ..cuda import cupyx_ops

    cupyx_ops.scatter_add(out, tuple(xp.asarray(c) for c in coords), g)
    return out


def _infer_take_along(x, idx, axis):
    require_int("take_along_axis", idx, 1)
    if len(idx.shape) != len(x.shape) or any(
            a != b for d, (a, b) in enumerate(zip(idx.shape, x.shape)) if d != axis):
        raise ShapeError(f"op 'take_along_axis': indices of shape {describe(idx.shape)} must "
                         f"have the shape of argument 0 {describe(x.shape)} on every axis but "
                         f"{axis}")
    return Aval(tuple(idx.shape), np.dtype(x.dtype))


def _infer_put_along_add(g, idx, axis, size):
    if tuple(idx.shape) != tuple(g.shape):
        raise ShapeError(f"op 'put_along_axis_add': indices of shape {describe(idx.shape)} must "
                         f"have the shape of argument 0 {describe(g.shape)}")
    require_int("put_along_axis_add", idx, 1)
    return Aval(shape.resized(g.shape, axis, size), np.dtype(g.dtype))


# The pair are each other's adjoint: a pick along an axis, and its scatter-add back.
TAKE_ALONG_AXIS = register(Op(
    "take_along_axis", _take_along_forward, _infer_take_along,
    lambda g, out, x, idx, axis: (put_along_axis_add(g, idx, axis, x.shape[axis]), None),
    nondiff_args=(1,), batch=batching.along_axis_rule))
PUT_ALONG_AXIS_ADD = register(Op(
    "put_along_axis_add", _put_along_add_forward, _infer_put_along_add,
    lambda g, out, x, idx, axis, size: (take_along_axis(g, idx, axis), None),
    nondiff_args=(1,), batch=batching.along_axis_rule))


def take_along_axis(x, indices, axis):
    """``x``'s elements at ``indices`` along ``axis`` (``numpy.take_along_axis``, PyTorch's
    ``gather``), ``indices`` having ``x``'s shape on the other axes and lying in
    ``[0, x.shape[axis])``. Unlike :func:`mc.gather` the indices may be a traced value
    (argsort's); the gradient scatter-adds back (:func:`put_along_axis_add`)."""
    axis = normalize_axis("take_along_axis", int(axis), len(x.shape))
    return apply(TAKE_ALONG_AXIS, x, indices, axis=axis)


def put_along_axis_add(values, indices, axis, size):
    """Zeros with ``size`` entries along ``axis``, ``values`` added at ``indices`` (repeated
    indices add up): the adjoint of :func:`take_along_axis`."""
    axis = normalize_axis("put_along_axis_add", int(axis), len(values.shape))
    return apply(PUT_ALONG_AXIS_ADD, values, indices, axis=axis, size=int(size))


def sort(x, axis=-1, descending=False, stable=True):
    """``(values, indices)`` of ``x`` sorted along ``axis`` (PyTorch's ``sort``; NumPy's
    ``sort`` is the values, ``argsort`` the indices). Stable; the gradient goes to each value's
    place."""
    if len(x.shape) == 0:
        return SortResult(x, shape.reshape(argsort(x, axis), ()))
    idx = argsort(x, axis, descending)
    return SortResult(take_along_axis(x, idx, axis), idx)


def topk(x, k, axis=-1, largest=True, sorted=True):  # noqa: A002 (PyTorch's name)
    """``(values, indices)`` of the ``k`` largest (``largest=False``: smallest) elements
    along ``axis``, largest first; of equal values the first ones."""
    axis = normalize_axis("topk", int(axis), len(x.shape), zero_d=True)
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


# Not registered: it holds its (value-dependent) result as an attribute; through apply it makes
# unique's results Tensors without this layer knowing the class, and a gradient through them a
# clear error, as PyTorch's is.
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
    data = x._array if hasattr(x, "_array") else np.asarray(x)  # a Tensor's, or the data
    xp = backend.get_array_module(data)
    if axis is not None:
        axis = normalize_axis("unique", int(axis), data.ndim)
    values, inverse, counts = xp.unique(data, return_inverse=True, return_counts=True,
                                        axis=axis, equal_nan=False)
    inverse = inverse.reshape(data.shape if axis is None else (-1,)).astype(np.int64)
    results = ([values] + [inverse] * bool(return_inverse)
               + [counts.astype(np.int64)] * bool(return_counts))
    # apply runs plain arrays as Tensors too: each result a Tensor, values refusing gradients
    out = [apply(_UNIQUE, x if hasattr(x, "_array") else data, result=r) for r in results]
    return tuple(out) if len(out) > 1 else out[0]
