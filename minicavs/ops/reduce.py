"""Reductions over axes. Primitives: sum, max, min, prod, argmax, argmin, and the running sum
cumsum; composed from them: mean, var, std, logsumexp, any, all."""

import builtins

import numpy as np

from . import batching, elementwise, indexing, shape
from .registry import Aval, Op, apply, normalize_axis, normalize_axes, register, result_dtype
from .rows import FULL, KEEPS
from ..cpu import products as native_products
from ..errors import ArgumentError, ShapeError


def _reduced_shape(x_shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(x_shape))
    return tuple(d for i, d in enumerate(x_shape) if i not in axes)


def _reduction(name, allow_empty, vjp, **rules):
    """Register the reduction NumPy calls ``name`` over attrs["axes"]; ``allow_empty``: an
    empty axis has a value (a sum's 0), else it is an error."""
    def infer(x, axes, keepdims):
        if not allow_empty and builtins.any(x.shape[a] == 0 for a in axes):
            raise ShapeError(f"op '{name}': cannot reduce an empty axis of argument 0 with "
                             f"shape {tuple(x.shape)} over axes {axes}")
        return Aval(_reduced_shape(tuple(x.shape), axes, keepdims), np.dtype(x.dtype))

    def forward(xp, x, axes, keepdims):
        return getattr(xp, name)(x, axis=axes, keepdims=keepdims)
    return register(Op(name, rules.pop("forward", forward), infer, vjp, batch=_batch_reduce,
                       **rules))


def _column_sums(xp, x, axes, keepdims):
    """A matrix's column sums (the rows summed: a bias's gradient) as one product, ones · X:
    on NumPy a BLAS gemv, 3-5x faster than ``np.sum`` over axis 0 at 64-20,000 rows and more
    accurate (NumPy adds float32 rows one after another); inside a call of native loops a
    product like the others (``cpu/products.py``), on the team, its rows split, where measured
    faster (Tree-FC's bias, 32,704 x 256: 3.8 ms on one thread, 1.7 on the team of two). On
    CuPy one cuBLAS call: CuPy's reduction over axis 0 took 294 us of an H200 for that bias
    (110 GB/s) and 40-80 us of host time. Any other sum is the array module's."""
    if axes != (0,) or x.ndim != 2 or x.dtype not in _GEMV_DTYPES \
            or x.shape[0] < 2 or x.strides[1] != x.itemsize:
        return xp.sum(x, axis=axes, keepdims=keepdims)
    if xp is np:
        ones = np.ones((1, x.shape[0]), x.dtype)
        sums = native_products.matmul(ones, x)
        sums = (ones[0] @ x)[None] if sums is None else sums
    else:
        from ..cuda import blas

        sums = blas.matmul(xp, blas.ones_row(xp, x.shape[0], x.dtype), x)
    return sums if keepdims else sums[0]


_GEMV_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


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


def _sum_on_nonzero_rows(xp, node, args, range_of, within):
    """A sum over the rows of a value zero outside some of them: those rows summed (a bias's
    gradient where the loss reads some vertices only); None where they are all the rows."""
    x, = node.inputs
    axes, keepdims = node.attrs["axes"], node.attrs["keepdims"]
    if 0 not in axes or not batching.row_domain(x.shape):
        return None
    n = args[0].shape[0]
    lo, hi = range_of(x)
    lo, hi = builtins.max(lo, 0), builtins.min(hi, n)
    if hi - lo >= n:
        return None
    return _column_sums(xp, args[0][lo:builtins.max(lo, hi)], axes, keepdims), None


def _zero_rows_reduce(ranges, axes, keepdims):
    return FULL if 0 in axes else KEEPS(ranges)  # reducing over the rows mixes them


def product_of_others(x, nonzero, product, zeros):
    """Per element of ``x``, the product of the *other* elements of its group, from the group's
    ``product`` of its nonzero elements and its count of ``zeros``: exact at zeros (with one
    zero only that element gets the product of the rest; with two, none does)."""
    ew = elementwise
    return ew.where(nonzero, ew.where(ew.equal(zeros, 0), product / ew.where(nonzero, x, 1), 0),
                    ew.where(ew.equal(zeros, 1), product, 0))


def _prod_vjp(g, out, x, axes, keepdims):
    nonzero = elementwise.not_equal(x, 0)
    product = prod(elementwise.where(nonzero, x, 1), axis=axes, keepdims=True)
    zeros = sum(elementwise.astype(elementwise.logical_not(nonzero), x.dtype), axes, True)
    g = shape.reshape(g, _reduced_shape(tuple(x.shape), axes, True))
    return (g * product_of_others(x, nonzero, product, zeros),)


def _infer_arg(name):
    def infer(x, axis, keepdims):
        if axis is None:
            if int(np.prod(x.shape)) == 0:
                raise ShapeError(f"op '{name}': argument 0 with shape {tuple(x.shape)} is empty")
            return Aval((1,) * len(x.shape) if keepdims else (), np.dtype(np.int64))
        if x.shape[axis] == 0:
            raise ShapeError(f"op '{name}': cannot reduce the empty axis {axis} of argument 0 "
                             f"with shape {tuple(x.shape)}")
        return Aval(_reduced_shape(tuple(x.shape), (axis,), keepdims), np.dtype(np.int64))
    return infer


def _arg_forward(fn):
    def forward(xp, x, axis, keepdims):
        return getattr(xp, fn)(x, axis=axis, keepdims=keepdims).astype(np.int64, copy=False)
    return forward


def _batch_arg(op, items, attrs, out):
    (x, d), = items
    if attrs["axis"] is None:  # over each vertex's elements: flatten them first
        flat = shape.reshape(x, (batching.row_count(d), -1)) if len(x.shape) != 2 else x
        result = apply(op, flat, axis=1, keepdims=False)
        return shape.reshape(result, (batching.row_count(d),) + tuple(out.shape))
    return apply(op, x, **dict(attrs, axis=attrs["axis"] + 1))


def reverse_cumsum(x, axis):
    """``sum(x[i:])`` at every i along ``axis``, summed from the end: the shortcut
    ``sum(x) - cumsum(x) + x`` cancels catastrophically (with weights [1e8, 1, 1] in float32 it
    gives [1e8, 1, 1] for [1e8 + 2, 2, 1])."""
    return indexing.flip(cumsum(indexing.flip(x, axis), axis), axis)


def _cumsum_vjp(g, out, x, axis):
    # The gradient of a running sum is the running sum from the other end.
    return (reverse_cumsum(g, axis),)


SUM = _reduction("sum", True, _sum_vjp, zero_rows=_zero_rows_reduce, native="sum",
                 forward=_column_sums, on_nonzero_rows=_sum_on_nonzero_rows)
MAX = _reduction("max", False, _max_vjp, zero_rows=_zero_rows_reduce)
MIN = _reduction("min", False, _max_vjp, zero_rows=_zero_rows_reduce)
PROD = _reduction("prod", True, _prod_vjp)
ARGMAX = register(Op("argmax", _arg_forward("argmax"), _infer_arg("argmax"), batch=_batch_arg))
ARGMIN = register(Op("argmin", _arg_forward("argmin"), _infer_arg("argmin"), batch=_batch_arg))
CUMSUM = register(Op("cumsum", lambda xp, x, axis: xp.cumsum(x, axis=axis, dtype=x.dtype),
                     lambda x, axis: Aval(tuple(x.shape), np.dtype(x.dtype)), _cumsum_vjp,
                     batch=batching.along_axis_rule,
                     zero_rows=lambda ranges, axis: FULL if axis == 0 else KEEPS(ranges)))


def _wide_int(x):
    """Sums of bools and small integers are int64 (uint64 for unsigned), as in NumPy and
    PyTorch: a count of a mask must not wrap around."""
    kind, size = np.dtype(x.dtype).kind, np.dtype(x.dtype).itemsize
    if kind == "b" or (kind in "iu" and size < 8):
        return elementwise.astype(x, np.uint64 if kind == "u" else np.int64)
    return x


def sum(x, axis=None, keepdims=False):  # noqa: A001 (mirrors numpy.sum)
    """Sum over ``axis`` (None: all axes; an int or a tuple)."""
    return apply(SUM, _wide_int(x), axes=normalize_axes("sum", axis, len(x.shape)),
                 keepdims=bool(keepdims))


def add_n(xs):
    """The sum of the tensors ``xs`` (a list; DyNet's ``esum``, TensorFlow's ``add_n``), added
    as a balanced tree: ``n - 1`` adds, ``ceil(log2 n)`` deep, operands broadcasting as ``+``.

    Per-sample code sums lists of every length — a sentence's per-word losses — and under
    ``mc.autobatch`` this form batches: every add is the same signature, so the sums of all
    the lists run level by level, a few batches in all. ``sum(stack(xs))`` computes the same
    but its shapes name the length: one batch pair per distinct length (measured on the
    tagger, 64 sentences: 153 batches against 110, the step 18 % slower)."""
    if hasattr(xs, "shape"):  # (iterating one tensor would sum its rows: not what was meant)
        raise ArgumentError(f"add_n: takes a list of tensors, got one of shape "
                            f"{tuple(xs.shape)}; for the sum of its elements use mc.sum")
    xs = list(xs)
    if not xs:
        raise ArgumentError("add_n: needs at least one tensor, got an empty list")
    while len(xs) > 1:  # neighbours added pairwise; an odd one out waits for the next level
        xs = [xs[i] + xs[i + 1] if i + 1 < len(xs) else xs[i] for i in range(0, len(xs), 2)]
    return xs[0]


def max(x, axis=None, keepdims=False):  # noqa: A001 (mirrors numpy.max)
    """The largest element over ``axis``; the gradient is shared equally among ties."""
    return apply(MAX, x, axes=normalize_axes("max", axis, len(x.shape)), keepdims=bool(keepdims))


def min(x, axis=None, keepdims=False):  # noqa: A001 (mirrors numpy.min)
    return apply(MIN, x, axes=normalize_axes("min", axis, len(x.shape)), keepdims=bool(keepdims))


def prod(x, axis=None, keepdims=False):
    """The product over ``axis``; its gradient is exact where elements are zero."""
    return apply(PROD, _wide_int(x), axes=normalize_axes("prod", axis, len(x.shape)),
                 keepdims=bool(keepdims))


def _arg(op, x, axis, keepdims):
    if axis is not None:  # (a 0-d x takes axis 0 or -1: the index of its one element)
        axis = normalize_axis(op.name, int(axis), len(x.shape), zero_d=True)
        axis = axis if len(x.shape) else None
    return apply(op, x, axis=axis, keepdims=bool(keepdims))


def argmax(x, axis=None, keepdims=False):
    """The index (int64) of the first largest element along ``axis`` (None: of the flattened
    array). Not differentiable: an index has no gradient."""
    return _arg(ARGMAX, x, axis, keepdims)


def argmin(x, axis=None, keepdims=False):
    return _arg(ARGMIN, x, axis, keepdims)


def along_axis(op, x, axis, **attrs):
    """``op`` along ``axis`` of ``x``; a 0-d ``x`` takes axis 0 or -1, as a vector of one
    element (as in PyTorch)."""
    axis = normalize_axis(op.name, int(axis), len(x.shape), zero_d=True)
    if len(x.shape):
        return apply(op, x, axis=axis, **attrs)
    return shape.reshape(apply(op, shape.reshape(x, (1,)), axis=0, **attrs), ())


def cumsum(x, axis=-1):
    """The running sum along ``axis`` (bools and small integers as int64)."""
    return along_axis(CUMSUM, _wide_int(x), axis)


def mean(x, axis=None, keepdims=False):
    """The mean over ``axis``: an integer or bool input gives the default float dtype (sum,
    then a weak float scale, see registry.py); an empty axis gives NaN, as in NumPy."""
    axes = normalize_axes("mean", axis, len(x.shape))
    count = int(np.prod([x.shape[a] for a in axes]))
    return sum(x, axes, keepdims) * (1.0 / count if count else float("nan"))


def var(x, axis=None, keepdims=False, ddof=0):
    """The variance over ``axis``: the mean squared deviation, divided by ``max(n - ddof, 0)``
    (NumPy's default ddof=0; PyTorch's ``unbiased=True`` is ddof=1). With ``ddof >= n`` that is
    a division by zero, as in NumPy and PyTorch: inf, or NaN where every value is equal (and
    for an empty axis)."""
    axes = normalize_axes("var", axis, len(x.shape))
    count = int(np.prod([x.shape[a] for a in axes]))
    deviation = x - mean(x, axes, keepdims=True)
    total = sum(deviation * deviation, axes, keepdims)
    if count > ddof:
        return total * (1.0 / (count - ddof))
    return total / elementwise.zeros_like(total)  # x / 0: inf, 0 / 0: NaN


def std(x, axis=None, keepdims=False, ddof=0):
    return elementwise.pow(var(x, axis, keepdims, ddof), 0.5)


def logsumexp(x, axis=None, keepdims=False):
    """``log(sum(exp(x)))`` over ``axis``, shifted by the maximum so nothing overflows; an axis
    that is all -inf gives -inf (the shift is then 0, not -inf - -inf)."""
    axes = normalize_axes("logsumexp", axis, len(x.shape))
    x = elementwise.astype(x, result_dtype([x.dtype], to_float=True))
    if builtins.any(x.shape[a] == 0 for a in axes):  # the log of an empty sum: -inf
        return elementwise.zeros_like(sum(x, axes, keepdims)) - float("inf")
    top = max(x, axes, keepdims=True)
    shift = elementwise.where(elementwise.isfinite(top), top, 0)
    total = sum(elementwise.exp(x - shift), axes, keepdims=True)
    result = elementwise.log(total) + shift
    return result if keepdims else shape.reshape(result, _reduced_shape(tuple(x.shape), axes,
                                                                       False))


def any(x, axis=None, keepdims=False):  # noqa: A001 (mirrors numpy.any)
    """Whether any element over ``axis`` is nonzero (an empty axis: False)."""
    axes = normalize_axes("any", axis, len(x.shape))
    return elementwise.greater(sum(elementwise.not_equal(x, 0), axes, keepdims), 0)


def all(x, axis=None, keepdims=False):  # noqa: A001 (mirrors numpy.all)
    """Whether every element over ``axis`` is nonzero (an empty axis: True)."""
    return elementwise.logical_not(any(elementwise.equal(x, 0), axis, keepdims))
