"""PyTorch's scatters along an axis: ``scatter`` (write), ``scatter_add`` and
``scatter_reduce`` ("sum", "prod", "mean", "amax", "amin"; ``include_self`` as PyTorch).

``index`` is data (NumPy, CuPy, a list or an integer Tensor), checked up front. Every element
``index[c]`` names the position of ``src[c]`` in the output: ``c`` with its ``axis`` coordinate
replaced by ``index[c]``. With the positions computed in NumPy, each scatter is a composite of
row primitives on the flattened arrays: sums are one ``scatter_add_rows`` (whose gradient is
a ``take_rows``), a write is the last writer's value under a mask, and the products and
extrema are the primitive ``scatter_reduce_rows``, whose gradient is written beside it:
a product's gradient is the product of the others (exact at zeros, as ``prod``'s), an
extremum's is shared equally among the values equal to it (as ``max``'s).

A repeated index writes the last of its values in ``scatter`` (NumPy's rule for assignment;
PyTorch leaves it undefined), and only that one gets a gradient.
"""

import numpy as np

from . import elementwise as ew, index as rows, indexing, reduce as reductions, shape
from .. import backend
from .arithmetic import floor_divide
from .registry import Aval, Op, apply, common_dtype, describe, normalize_axis, register
from ..errors import ArgumentError, IndexRangeError, ShapeError

_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")
_UFUNCS = {"prod": "multiply", "amax": "maximum", "amin": "minimum"}


def _scatter_reduce_rows_forward(xp, base, values, targets, reduce):
    out = xp.array(base, order="C")  # a copy, with the rows the CUDA kernel needs
    ufunc = _UFUNCS[reduce]
    kernels, targets32 = rows._row_kernels(xp, values, targets, base.shape[0])
    if kernels is not None and out.dtype == values.dtype:  # one fold per output element
        return kernels.scatter_reduce_rows(xp.ascontiguousarray(values), targets32, out, ufunc,
                                           check_indices=False)
    if xp is not np:  # other dtypes on a GPU: folded on the host (a rare, slow path)
        host = backend.to_numpy(out)
        getattr(np, ufunc).at(host, backend.to_numpy(targets), backend.to_numpy(values))
        return xp.asarray(host)
    getattr(np, ufunc).at(out, targets, values)
    return out


def _infer_scatter_reduce_rows(base, values, targets, reduce):
    dtype = common_dtype("scatter_reduce_rows", (base, values))
    if tuple(targets.shape) != tuple(values.shape[:1]) or tuple(base.shape[1:]) != tuple(
            values.shape[1:]):
        raise ShapeError(f"op 'scatter_reduce_rows': argument 2 must index the rows of "
                         f"argument 1, rows like argument 0's, got shapes "
                         f"{describe(base.shape)}, {describe(values.shape)} and "
                         f"{describe(targets.shape)}")
    return Aval(tuple(base.shape), dtype)


def _scatter_reduce_rows_vjp(g, out, base, values, targets, reduce):
    num_rows = base.shape[0]
    if reduce == "prod":  # each element's gradient: the product of the others in its row
        base_nonzero, values_nonzero = ew.not_equal(base, 0), ew.not_equal(values, 0)
        product = scatter_reduce_rows(ew.where(base_nonzero, base, 1),
                                      ew.where(values_nonzero, values, 1), targets, "prod")
        zeros = ew.astype(ew.logical_not(base_nonzero), g.dtype) + rows.scatter_add_rows(
            ew.astype(ew.logical_not(values_nonzero), g.dtype), targets, num_rows)
        others = reductions.product_of_others
        return (g * others(base, base_nonzero, product, zeros),
                rows.take_rows(g, targets) * others(values, values_nonzero,
                                                    rows.take_rows(product, targets),
                                                    rows.take_rows(zeros, targets)), None)
    # amax, amin: the gradient is shared among the elements equal to the result
    at_base = ew.equal(base, out)
    at_values = ew.equal(values, rows.take_rows(out, targets))
    count = ew.astype(at_base, g.dtype) + rows.scatter_add_rows(ew.astype(at_values, g.dtype),
                                                                 targets, num_rows)
    share = g / ew.where(ew.equal(count, 0), 1, count)
    return (ew.where(at_base, share, 0),
            ew.where(at_values, rows.take_rows(share, targets), 0), None)


# No batching rule: the positions are data computed for one whole array.
SCATTER_REDUCE_ROWS = register(Op("scatter_reduce_rows", _scatter_reduce_rows_forward,
                                  _infer_scatter_reduce_rows, _scatter_reduce_rows_vjp,
                                  nondiff_args=(2,), promotes=(0, 1)))


def scatter_reduce_rows(base, values, targets, reduce):
    """``base`` with each row ``values[i]`` combined into row ``targets[i]`` by ``reduce``
    ("prod", "amax" or "amin"). The targets must lie in ``[0, len(base))``."""
    return apply(SCATTER_REDUCE_ROWS, base, values, targets, reduce=reduce)


# --- the positions ----------------------------------------------------------------------------

_on_device = indexing._on_device_of  # index data where x lives


def _strides(shape_):
    return np.cumprod((tuple(shape_[1:]) + (1,))[::-1])[::-1].astype(np.int64)


def _positions(name, x, axis, index, src):
    """(flat targets in ``x``, flat sources in ``src`` or None if all of it, in order), NumPy
    int64, after checking ``index`` as PyTorch does."""
    idx = indexing._concrete(name, index)
    if idx.dtype.kind not in "iu":
        raise IndexRangeError(f"{name}: index must hold integers, got dtype {idx.dtype}")
    idx = idx.astype(np.int64)
    ndim = len(x.shape)
    if idx.ndim != ndim:
        raise ShapeError(f"{name}: index has {idx.ndim} dimension(s) and input has {ndim}; "
                         f"they must have the same rank")
    for d in range(ndim):
        if d != axis and idx.shape[d] > x.shape[d]:
            raise ShapeError(f"{name}: index of shape {describe(idx.shape)} is larger than "
                             f"input {describe(x.shape)} on axis {d}")
        if src is not None and idx.shape[d] > src.shape[d]:
            raise ShapeError(f"{name}: index of shape {describe(idx.shape)} is larger than "
                             f"src {describe(src.shape)} on axis {d}")
    size = x.shape[axis]
    bad = (idx < 0) | (idx >= size)
    if bad.any():
        position = tuple(int(i[0]) for i in np.nonzero(bad))
        raise IndexRangeError(f"{name}: index {int(idx[position])} at position {position} is "
                              f"out of range for axis {axis} of input with size {size}")
    coords = np.indices(idx.shape, dtype=np.int64, sparse=True)
    strides = _strides(x.shape)
    targets = idx * strides[axis] + sum(c * s for d, (c, s) in enumerate(zip(coords, strides))
                                        if d != axis)
    sources = None
    if src is not None and tuple(idx.shape) != tuple(src.shape):
        sources = sum(c * s for c, s in zip(coords, _strides(src.shape)))
        sources = np.broadcast_to(sources, idx.shape).reshape(-1)
    return np.broadcast_to(targets, idx.shape).reshape(-1), sources


def _picked(src, sources):
    """The values of ``src`` that are scattered, flattened, in index order."""
    flat = shape.reshape(src, (-1,))
    return flat if sources is None else rows.take_rows(flat, _on_device(src, sources))


def _written(x, targets):
    mask = np.zeros(int(np.prod(x.shape)), bool)
    mask[targets] = True
    return _on_device(x, mask.reshape(tuple(x.shape)))


def _as_operand(x, src):
    """``src`` as a tensor operand of ``x``'s dtype (PyTorch requires src of input's dtype;
    here a number or another dtype is converted)."""
    if not hasattr(src, "shape"):
        src = np.asarray(src, dtype=x.dtype)
    return ew.astype(src, x.dtype) if np.dtype(src.dtype) != np.dtype(x.dtype) else src


def _sum_into(x, targets, values):
    return shape.reshape(rows.scatter_add_rows(values, _on_device(x, targets),
                                               int(np.prod(x.shape))), tuple(x.shape))


# --- the public functions ---------------------------------------------------------------------

def scatter_add(x, axis, index, src):
    """``x`` with ``src[c]`` added at ``index[c]`` along ``axis`` (``torch.scatter_add``);
    repeated indices add up."""
    axis = normalize_axis("scatter_add", int(axis), len(x.shape))
    src = _as_operand(x, src)
    targets, sources = _positions("scatter_add", x, axis, index, src)
    return x + _sum_into(x, targets, _picked(src, sources))


def scatter(x, axis, index, src=None, value=None, reduce=None):
    """``x`` with ``src[c]`` (or the number ``value``) written at ``index[c]`` along ``axis``
    (``torch.scatter``); of repeated indices the last one's value is written. ``reduce``
    "add" or "multiply" (PyTorch's older form) combines instead of writing."""
    if (src is None) == (value is None):
        raise ArgumentError("scatter: give exactly one of src (a tensor) and value (a number)")
    if reduce is not None:
        reductions = {"add": "sum", "multiply": "prod"}
        if reduce not in reductions:
            raise ArgumentError(f"scatter: reduce must be 'add' or 'multiply', got {reduce!r}")
        if value is not None:
            src = ew.astype(ew.zeros_like(x), x.dtype) + np.asarray(value).astype(x.dtype)
        return scatter_reduce(x, axis, index, src, reductions[reduce])
    axis = normalize_axis("scatter", int(axis), len(x.shape))
    if value is not None:
        targets, _ = _positions("scatter", x, axis, index, None)
        return ew.where(_written(x, targets), np.asarray(value).astype(x.dtype), x)
    src = _as_operand(x, src)
    targets, sources = _positions("scatter", x, axis, index, src)
    order = np.arange(len(targets)) if sources is None else sources
    # the last writer of each position: the first of the reversed targets
    _, first = np.unique(targets[::-1], return_index=True)
    last = len(targets) - 1 - first
    values = rows.take_rows(shape.reshape(src, (-1,)), _on_device(src, order[last]))
    return ew.where(_written(x, targets), _sum_into(x, targets[last], values), x)


def scatter_reduce(x, axis, index, src, reduce, include_self=True):
    """``x`` with the values ``src[c]`` combined into position ``index[c]`` along ``axis`` by
    ``reduce``: "sum", "prod", "mean", "amax" or "amin" (``torch.scatter_reduce``). With
    ``include_self=False`` the values of ``x`` at the positions written are left out;
    positions no index names keep ``x``'s value. The mean of integers rounds down, as in
    PyTorch."""
    if reduce not in _REDUCTIONS:
        raise ArgumentError(f"scatter_reduce: reduce must be one of {', '.join(_REDUCTIONS)}, "
                            f"got {reduce!r}")
    axis = normalize_axis("scatter_reduce", int(axis), len(x.shape))
    src = _as_operand(x, src)
    targets, sources = _positions("scatter_reduce", x, axis, index, src)
    values = _picked(src, sources)
    written = _written(x, targets)
    if reduce in ("sum", "mean"):
        base = x if include_self else ew.where(written, 0, x)
        total = base + _sum_into(x, targets, values)
        if reduce == "sum":
            return total
        counts = np.bincount(targets, minlength=int(np.prod(x.shape))) + int(bool(include_self))
        counts = _on_device(x, np.maximum(counts, 1).reshape(tuple(x.shape)).astype(x.dtype))
        mean = total / counts if np.dtype(x.dtype).kind == "f" else floor_divide(total, counts)
        return ew.where(written, mean, x)
    if not include_self:
        x = ew.where(written, _identity(reduce, x.dtype), x)
    flat = scatter_reduce_rows(shape.reshape(x, (-1,)), values, _on_device(x, targets),
                               reduce)
    return shape.reshape(flat, tuple(x.shape))


def _identity(reduce, dtype):
    """The value that leaves ``reduce`` unchanged, in ``dtype``."""
    dtype = np.dtype(dtype)
    if reduce == "prod":
        return dtype.type(1)
    if dtype.kind == "f":
        return dtype.type(-np.inf if reduce == "amax" else np.inf)
    if dtype.kind == "b":
        return np.bool_(reduce == "amin")
    info = np.iinfo(dtype)
    return dtype.type(info.min if reduce == "amax" else info.max)
