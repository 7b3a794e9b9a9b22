"""Running products and extrema along an axis: ``cumprod`` (a primitive, its gradient exact
where elements are zero) and ``cummax``/``cummin``, whose indices come from the primitives
``cumargmax``/``cumargmin`` and whose values are picked with them, so their gradient goes to
the element each running extremum came from (PyTorch's rule).

Which index a tie gets follows PyTorch: the last of equal values (``x >= running max``), and
a NaN is the extremum from where it occurs (a later NaN takes over).
"""

import numpy as np

from . import batching, elementwise as ew, reduce, shape, sorting
from .registry import Aval, Op, normalize_axis, register
from .rows import FULL, KEEPS
from .sorting import SortResult


def _cumprod_vjp(g, out, x, axis):
    """d out_j / d x_i = prod_{k <= j, k != i} x_k for j >= i. Before the first zero of a
    slice that is out_j / x_i, so the gradient is a reverse running sum of g·out over x_i; at
    the first zero z it is the same sum of g times the running product with x_z taken as 1;
    after z every such product holds x_z = 0."""
    zero = ew.equal(x, 0)
    zeros_so_far = reduce.cumsum(ew.astype(zero, np.int64), axis)
    before = ew.equal(zeros_so_far, 0)
    first_zero = ew.logical_and(zero, ew.equal(zeros_so_far, 1))
    plain = reduce.reverse_cumsum(g * out, axis) / ew.where(before, x, 1)
    skipping = reduce.reverse_cumsum(g * cumprod(ew.where(first_zero, 1, x), axis), axis)
    return (ew.where(before, plain, ew.where(first_zero, skipping, 0)),)


CUMPROD = register(Op("cumprod", lambda xp, x, axis: xp.cumprod(x, axis=axis, dtype=x.dtype),
                      lambda x, axis: Aval(tuple(x.shape), np.dtype(x.dtype)), _cumprod_vjp,
                      batch=batching.along_axis_rule,
                      zero_rows=lambda ranges, axis: FULL if axis == 0 else KEEPS(ranges)))


def _accumulate(xp, ufunc, x, axis):
    """``ufunc.accumulate(x, axis)`` for an associative ``ufunc`` (maximum, minimum); on CuPy,
    which lacks it for these, as log2(n) shifted steps (Hillis and Steele's scan)."""
    if xp is np:
        return getattr(np, ufunc).accumulate(x, axis=axis)
    out = xp.moveaxis(x, axis, 0).copy()
    step = 1
    while step < out.shape[0]:
        out[step:] = getattr(xp, ufunc)(out[step:], out[:-step].copy())
        step *= 2
    return xp.moveaxis(out, 0, axis)


def _cumarg_forward(largest):
    def forward(xp, x, axis):
        running = _accumulate(xp, "maximum" if largest else "minimum", x, axis)
        # the running extremum changes to x_i exactly where x_i equals it (ties: the last),
        # or where x_i is NaN; elsewhere the index stays that of the step before
        hit = x == running
        if x.dtype.kind == "f":
            hit |= xp.isnan(x)
        positions = xp.arange(x.shape[axis], dtype=np.int64).reshape(
            shape.resized((1,) * x.ndim, axis, x.shape[axis]))
        return _accumulate(xp, "maximum", xp.where(hit, positions, 0), axis)
    return forward


def _infer_cumarg(x, axis):
    return Aval(tuple(x.shape), np.dtype(np.int64))


CUMARGMAX = register(Op("cumargmax", _cumarg_forward(True), _infer_cumarg, batch=batching.along_axis_rule))
CUMARGMIN = register(Op("cumargmin", _cumarg_forward(False), _infer_cumarg, batch=batching.along_axis_rule))


def cumprod(x, axis=-1):
    """The running product along ``axis`` (bools and small integers as int64, as ``cumsum``)."""
    return reduce.along_axis(CUMPROD, reduce._wide_int(x), axis)


def _cumulative_extremum(op, name, x, axis):
    axis = normalize_axis(name, int(axis), len(x.shape), zero_d=True)
    indices = reduce.along_axis(op, x, axis)  # (a 0-d x is its own running extremum)
    return SortResult(sorting.take_along_axis(x, indices, axis) if len(x.shape) else x, indices)


def cummax(x, axis=-1):
    """``(values, indices)``: the running maximum along ``axis`` and where it was found."""
    return _cumulative_extremum(CUMARGMAX, "cummax", x, axis)


def cummin(x, axis=-1):
    """``(values, indices)``: the running minimum along ``axis`` and where it was found."""
    return _cumulative_extremum(CUMARGMIN, "cummin", x, axis)
