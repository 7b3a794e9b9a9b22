"""Row gathers and their adjoints: ``take_rows`` (index -1 gives a zero row) and
``scatter_add_rows`` (indices may repeat; their rows add up). ``embedding`` is a take of rows;
of one id (a word's, per step of per-sample code) it is ``take_row``, one node where a take
and a reshape would be two, expanded into them when traced. Indices are integer arrays; they
are data, never differentiated."""

import numpy as np

from . import batching, shape
from .. import backend
from ..cpu import kernels as native_kernels
from .registry import Aval, Op, apply, describe, register, require_int
from ..errors import GraphError, IndexRangeError, ShapeError


def _index_bounds(idx):
    """(min, max) of a non-empty index array as Python ints; on CuPy in one device-to-host
    copy (each ``int()`` of a device scalar is a synchronisation)."""
    if isinstance(idx, np.ndarray):
        return int(idx.min()), int(idx.max())
    xp = backend.get_array_module(idx)
    low, high = xp.stack((idx.min(), idx.max())).get().tolist()
    return int(low), int(high)


def out_of_range(idx, low, high):
    """None if every entry of ``idx`` lies in [low, high]; else an entry outside (the smallest
    or the largest) and its position (a tuple). An index array copied from the host passes
    on the bounds kept there (``backend.known_range``: no reduction, no wait for a GPU)."""
    known = backend.known_range(idx)
    if known is not None and low <= known[0] and known[1] <= high:
        return None
    least, most = _index_bounds(idx) if idx.size else (low, high)
    if low <= least and most <= high:
        return None
    bad = least if least < low else most
    return bad, tuple(int(i[0]) for i in (idx == bad).nonzero())


def _check_index_range(opname, idx, num_rows):
    found = out_of_range(idx, -1, num_rows - 1)
    if found is not None:
        raise IndexRangeError(f"op '{opname}': index {found[0]} at position {found[1][0]} is out "
                              f"of range for {num_rows} rows (valid: -1 for a zero row, "
                              f"0..{num_rows - 1})")


def _row_kernels(xp, rows, idx, num_rows):
    """The CUDA row kernels (minicavs/cuda/kernels.py) and the indices as int32, when they
    apply: CuPy arrays, float32/float64 rows, indices already checked to lie in -1..num_rows-1
    with num_rows below 2**31 (so the cast to int32, one launch, is exact). A gather or
    scatter-add is then one launch that handles -1 itself. Returns (None, idx) otherwise."""
    if (xp is np or rows.dtype not in _KERNEL_DTYPES or rows.ndim == 0
            or num_rows > np.iinfo(np.int32).max):
        return None, idx
    from ..cuda import kernels

    return kernels, xp.ascontiguousarray(idx, dtype=np.int32)


_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _take_rows_forward(xp, x, idx):
    if xp is np:  # (one native pass; None where it does not apply or an index is bad)
        out = native_kernels.take_rows(x, idx)
        if out is not None:
            return out
    _check_index_range("take_rows", idx, x.shape[0])
    kernels, idx32 = _row_kernels(xp, x, idx, x.shape[0])
    if kernels is not None:  # the range is checked above
        return kernels.gather_rows(xp.ascontiguousarray(x), idx32, check_indices=False)
    present = idx >= 0
    if xp is not np:  # asking the device whether any index is -1 would wait for it: mask instead
        if x.shape[0] == 0:  # every index is -1
            return xp.zeros((idx.shape[0],) + x.shape[1:], dtype=x.dtype)
        rows = xp.take(x, xp.where(present, idx, 0), axis=0)
        mask = present.reshape(present.shape + (1,) * (x.ndim - 1))
        return xp.where(mask, rows, xp.zeros((), dtype=x.dtype))
    if present.all():
        return np.take(x, idx, axis=0)
    out = np.zeros((idx.shape[0],) + x.shape[1:], dtype=x.dtype)
    out[present] = x[idx[present]]
    return out


def scatter_add_into(xp, out, idx, values):
    """``out[idx[i]] += values[i]`` for every i with idx[i] >= 0, repeated indices adding up.
    The indices must lie in -1..len(out)-1 (the callers check)."""
    kernels, idx32 = _row_kernels(xp, values, idx, out.shape[0])
    if kernels is not None and out.flags.c_contiguous and out.dtype == values.dtype:
        return kernels.scatter_add_rows(xp.ascontiguousarray(values), idx32, out,
                                        check_indices=False)
    if xp is np and native_kernels.scatter_add_rows(out, np.ascontiguousarray(idx, dtype=np.int64),
                                                    np.ascontiguousarray(values)):
        return out  # (one pass, in index order; the sparse product below where it is off)
    present = idx >= 0
    if xp is not np:  # no host round trip: -1 adds into a spare row, which is then dropped
        from ..cuda import cupyx_ops

        sums = xp.zeros((out.shape[0] + 1,) + out.shape[1:], dtype=out.dtype)
        cupyx_ops.scatter_add(sums, xp.where(present, idx, out.shape[0]), values)
        out += sums[:-1]
        return out
    if not present.all():
        idx, values = idx[present], values[present]
    if values.dtype.kind == "f" and values.ndim >= 1 and values.size:
        # A sparse (num_rows x n) matrix of ones times the values: each output row sums its
        # rows in index order, as np.add.at does, but in one pass (about 15x faster).
        flat = values.reshape(len(idx), -1)
        order = np.argsort(idx, kind="stable")  # CSR by hand: rows sorted, no COO conversion
        indptr = np.zeros(out.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(idx, minlength=out.shape[0]), out=indptr[1:])
        import scipy.sparse  # (here: SciPy is a fifth of ``import minicavs``)

        selector = scipy.sparse.csr_matrix((np.ones(len(idx), values.dtype), order, indptr),
                                           shape=(out.shape[0], len(idx)))
        out += (selector @ flat).reshape(out.shape)
    else:
        np.add.at(out, idx, values)
    return out


def _scatter_add_rows_forward(xp, g, idx, num_rows, checked=False):
    if not checked:  # (checked: take_rows' gradient, its indices checked by the take)
        _check_index_range("scatter_add_rows", idx, num_rows)
    return scatter_add_into(xp, xp.zeros((num_rows,) + g.shape[1:], dtype=g.dtype), idx, g)


def _infer_take_rows(x, idx):
    require_int("take_rows", idx, 1)
    if len(x.shape) == 0 or len(idx.shape) != 1:
        raise ShapeError(f"op 'take_rows': argument 0 must have rows and argument 1 must be a 1-D "
                         f"index, got shapes {describe(x.shape)} and {describe(idx.shape)}")
    return Aval((idx.shape[0],) + tuple(x.shape[1:]), np.dtype(x.dtype))


def _infer_scatter_add_rows(g, idx, num_rows, checked=False):  # noqa: ARG001
    require_int("scatter_add_rows", idx, 1)
    if len(g.shape) == 0 or tuple(idx.shape) != (g.shape[0],):
        raise ShapeError(f"op 'scatter_add_rows': argument 1 must index the rows of argument 0, "
                         f"got shapes {describe(g.shape)} and {describe(idx.shape)}")
    return Aval((num_rows,) + tuple(g.shape[1:]), np.dtype(g.dtype))


def _batch_take_rows(op, items, attrs, out):
    """take_rows, and take_row (one id per row: the batch's ids are a take of rows)."""
    (x, dx), (idx, di) = items
    if dx:
        raise GraphError(f"op '{op.name}': inside a vertex function the table must be shared "
                         f"(a parameter), not a per-vertex value")
    flat = shape.reshape(idx, (-1,)) if len(idx.shape) > 1 else idx
    rows = take_rows(x, flat)
    return shape.reshape(rows, (batching.row_count(di),) + tuple(out.shape))


def _take_rows_vjp(g, out, x, idx):
    """The rows' gradients added into the table's: the indices are those the take checked, so
    the scatter does not check them again (on a GPU each check is a wait for the device, here
    after the whole backward pass queued before it)."""
    return apply(SCATTER_ADD_ROWS, g, idx, num_rows=int(x.shape[0]), checked=True), None


TAKE_ROWS = register(Op("take_rows", _take_rows_forward, _infer_take_rows, _take_rows_vjp,
                        nondiff_args=(1,), batch=_batch_take_rows, row_index_arg=1))


def _take_row_forward(xp, x, idx):
    i = int(idx)
    if not -1 <= i < x.shape[0]:
        raise IndexRangeError(f"op 'take_row': index {i} is out of range for {x.shape[0]} rows "
                              f"(valid: -1 for a zero row, 0..{x.shape[0] - 1})")
    return xp.zeros(x.shape[1:], dtype=x.dtype) if i < 0 else x[i].copy()  # (not a view)


def _infer_take_row(x, idx):
    require_int("take_row", idx, 1)
    if len(x.shape) == 0 or len(idx.shape) != 0:
        raise ShapeError(f"op 'take_row': argument 0 must have rows and argument 1 must be one "
                         f"index (0-d), got shapes {describe(x.shape)} and {describe(idx.shape)}")
    return Aval(tuple(x.shape[1:]), np.dtype(x.dtype))


def _expand_take_row(x, idx):
    return shape.reshape(take_rows(x, shape.reshape(idx, (1,))), tuple(x.shape[1:]))


def _take_row_vjp(g, out, x, idx):
    # Only eager code differentiates take_row itself (traced or batched, it is take_rows). Its
    # 0-d id may be a NumPy one beside a table on the GPU: the one-row index goes where g is.
    one = backend.to_numpy(getattr(idx, "_array", idx)).reshape(1)
    if getattr(g, "device", "cpu") == "cuda":
        one = backend.to_device(one, "cuda")
    return scatter_add_rows(shape.reshape(g, (1,) + tuple(g.shape)), one, x.shape[0]), None


TAKE_ROW = register(Op("take_row", _take_row_forward, _infer_take_row, _take_row_vjp,
                       nondiff_args=(1,), batch=_batch_take_rows, expand=_expand_take_row))

# No batching rule: it only appears in ∂F, which is derived from the batched F.
SCATTER_ADD_ROWS = register(Op("scatter_add_rows", _scatter_add_rows_forward,
                               _infer_scatter_add_rows,
                               lambda g, out, x, idx, **attrs: (take_rows(g, idx), None),
                               nondiff_args=(1,), row_index_arg=1))


def _one_hot_forward(xp, labels, num_classes, dtype):
    found = out_of_range(labels, 0, num_classes - 1)
    if found is not None:
        raise IndexRangeError(f"op 'one_hot': label {found[0]} at position {found[1]} is out of "
                              f"range for {num_classes} classes")
    if xp is np:
        out = np.zeros(labels.shape + (num_classes,), dtype=dtype)
        np.put_along_axis(out, labels[..., None], 1, axis=-1)
        return out
    # CuPy < 14 has no put_along_axis; a comparison with the class numbers is one kernel.
    return (labels[..., None] == xp.arange(num_classes, dtype=labels.dtype)).astype(dtype)


def _infer_one_hot(labels, num_classes, dtype):
    require_int("one_hot", labels, 0)
    return Aval(tuple(labels.shape) + (num_classes,), np.dtype(dtype))


ONE_HOT = register(Op("one_hot", _one_hot_forward, _infer_one_hot,
                      batch=batching.leading_axes_rule))


def take_rows(x, idx):
    """Rows ``x[idx]``; an index of -1 gives a row of zeros."""
    return apply(TAKE_ROWS, x, idx)


def scatter_add_rows(values, idx, num_rows):
    """A ``(num_rows, ...)`` array with ``values[i]`` added into row ``idx[i]`` (-1: dropped)."""
    return apply(SCATTER_ADD_ROWS, values, idx, num_rows=int(num_rows))


def one_hot(labels, num_classes, dtype):
    return apply(ONE_HOT, labels, num_classes=int(num_classes), dtype=np.dtype(dtype))


def embedding(table, ids):
    """Look up rows of ``table`` for integer ``ids`` of any shape: result ``ids.shape + (D,)``."""
    if getattr(ids, "shape", None) == ():  # one id (a word's, per step): its row
        return apply(TAKE_ROW, table, ids)
    ids_shape = tuple(ids.shape)
    # plain data (a NumPy id) is reshaped by NumPy: no op to record for it
    flat = ids.reshape(-1) if type(ids) is np.ndarray else shape.reshape(ids, (-1,))
    rows = take_rows(table, flat)
    return shape.reshape(rows, ids_shape + tuple(table.shape[1:]))
